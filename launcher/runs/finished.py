"""Whether a checkpoint already holds the whole training run, so that nothing is left to train.

A rank killed after the final checkpoint was written, but before the trainer exited, leaves
checkpoint-<max_steps>. Resuming it makes HF Trainer run one step past max_steps (seen with
LLaMA-Factory 0.9.5 + transformers 5.6: global_step 11 of 10), so mlaunch does not launch.
"""
from __future__ import annotations

import os

from ..nodeprog.checkpoints import Discovery
from ..spec import JobBase

EPOCH_EPS = 1e-6   # trainer_state's epoch is a float sum of step fractions


def complete_line(job: JobBase, found: Discovery) -> str | None:
    """The "training already complete at checkpoint-N" line when found.latest is the end
    of this job's schedule (the spec's max_steps or epochs), else None.

    The spec decides, not the checkpoint's own max_steps: a spec that raised max_steps
    to train further must still resume.
    """
    tr, p = getattr(job, "training", None), found.progress
    if not found.latest or tr is None or "global_step" not in p:
        return None
    step = p["global_step"]
    if tr.max_steps:
        if step < tr.max_steps:
            return None
        goal = f"global_step {step} of max_steps {tr.max_steps}"
    else:
        same_plan = p.get("num_train_epochs") == tr.epochs and step >= p.get("max_steps", step + 1)
        if not (p.get("epoch", 0) >= tr.epochs - EPOCH_EPS or same_plan):
            return None
        goal = f"global_step {step}, epoch {p.get('epoch', 0):g} of epochs {tr.epochs:g}"
    name = os.path.basename(found.latest.rstrip("/"))
    return (f"training already complete at {name} ({goal}): not training again; "
            f"the final weights are in {found.latest}")

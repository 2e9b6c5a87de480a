"""tokenize_once (issue 54): LLaMA-Factory tokenizes the dataset once, on node 0, before any
rank starts (its tokenized_path), and staging copies the result node to node to every other
node; every rank then loads it and tokenizes nothing. Skipped on node 0 when what it holds was
made from the same YAML and the same staged items (a fingerprint beside it)."""
from __future__ import annotations

import hashlib
import json
import os
import time

from .. import nodeprog, render
from ..errors import UserError
from ..plan.launch_plan import LaunchPlan, remote_bin, remote_python
from ..record import fsmode
from ..spec.staging import NODE, StageItem
from .staging import TMP, Item, stage_items

TOKENIZE_TIMEOUT_S = 6 * 3600
LOG = "tokenize.log"   # in the run's log directory: LLaMA-Factory's own lines of that step


def tokenize_once(plan: LaunchPlan, executor, say, digests: dict[str, str]) -> None:
    """The dataset tokenized on node 0 (unless already, from the same inputs), then staged to
    every node; one line each. digests: the staged items' source digests (staging.stage)."""
    job = plan.job
    path = getattr(job, "tokenize_once", None)
    if not path:
        return
    node, python = plan.nodes[0], remote_python(job)
    out = path + ".mlaunch-out"
    yaml = render.llamafactory_yaml(job.model_copy(update={
        "tokenize_once": path + TMP, "output_dir": out, "report_to": "none", "deepspeed": None, "fsdp": None}),
        "tokenize", None, None)
    fingerprint = _fingerprint(job, digests)
    script = render.tokenize_script(node.env, remote_bin(job), python, path, out, yaml, fingerprint,
                                    nodeprog.script(python, "manifest", ["seal", path + TMP, path]))
    t0 = time.monotonic()
    code, text = executor.run(node.login, script, TOKENIZE_TIMEOUT_S)
    text = plan.mask(text)   # LLaMA-Factory ran with cluster.env's secrets exported
    log = os.path.join(fsmode.private_dir(plan.log_dir), LOG)   # the run's 0700 log dir, as the nodes' logs
    with fsmode.open_private(log) as f:
        f.write(text)
    status = next((ln.split(" ", 1)[1] for ln in reversed(text.splitlines())
                   if ln.startswith("mlaunch-tokenize ")), f"failed exit {code}")
    word, _, rest = status.partition(" ")
    if word == "failed":
        raise UserError(f"tokenize_once: node0 {node.host} could not tokenize the dataset: {rest} "
                        f"(LLaMA-Factory's output: {log}); nothing was started")
    if word == "same":
        say(f"tokenize_once {path}: in place on node0 {node.host} (made from the same YAML and staged data)")
    else:
        say(f"tokenize_once {path}: tokenized once on node0 {node.host} in {time.monotonic() - t0:.1f} s "
            f"({rest} rows; LLaMA-Factory's lines in {log})")
    stage_items(plan, executor, [Item(0, StageItem(src=NODE + path, dst=path), label="tokenize_once")], say)


def _fingerprint(job, digests: dict[str, str]) -> str:
    """What the tokens are made from: the model (its tokenizer), the stage, template, datasets,
    cutoff and passthrough keys (max_samples, packing, val_size, ...), and the content of every
    staged item (a changed data file changes it); not the schedule, batch or output_dir."""
    keys = {k: getattr(job, k) for k in ("model", "stage", "template", "dataset", "dataset_dir", "cutoff_len")}
    text = json.dumps({**keys, "passthrough": job.passthrough, "staged": digests}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()

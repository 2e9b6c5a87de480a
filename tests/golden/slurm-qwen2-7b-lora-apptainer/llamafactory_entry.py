"""mlaunch's entry for LLaMA-Factory jobs under DeepSpeed: `python llamafactory_entry.py JOB.yaml`.

It runs `llamafactory.launcher` unchanged, after one fix. The HF Trainer groups the trainable
parameters into decay / no-decay groups (LLaMA-Factory's LoRA+ into four), and with LoRA some
of them are empty. The LR scheduler is built from those groups; then deepspeed.initialize
removes the empty ones from the same optimizer (deepspeed/runtime/engine.py,
_configure_optimizer), and the scheduler step of torch 2.13 (zip(..., strict=True)) fails:
"zip() argument 2 is longer than argument 1". So the empty groups are removed when the
optimizer is created, before the scheduler sees them, as ms-swift's own trainer does
(swift/trainers/mixin.py, create_optimizer). The optimizer itself stays the trainer's own:
LoRA+, GaLore, BAdam, Adam-mini, Muon and the `optim` choices all keep working, with the
weight decay and betas of the YAML.

And a second fix, for a shrink: after a ZeRO universal load, each optimizer state gets its own
step tensor (templates/universal_steps.py.j2 says why).
"""
import os
import runpy
import sys

import transformers

# --- mlaunch: each optimizer state its own step after a universal load -----------------------
# DeepSpeed's ZeRO-3 universal loader (DeepSpeedZeroOptimizer_Stage3.
# load_hp_checkpoint_state_from_checkpoint_dir_stage3, 0.19.8) assigns the one `step` tensor it
# read to the state of every parameter sub-group. torch's Adam/AdamW increment each group's
# step in place, so with G groups the shared tensor advances G times per optimizer step and
# every bias correction after the load is wrong: a run shrunk through the universal checkpoint
# trains a different model (docs/upstream-zero3-universal-step.md has the reproduction).
# After any ZeRO universal load (stage 1/2, stage 3, the bf16 optimizer), every state whose
# step tensor is shared gets its own copy of the same value. Where the loader already gives
# each its own (ZeRO-1/2 today, a fixed ZeRO-3 later) nothing is changed: the fix is a no-op.
def _mlaunch_own_steps(optimizer):
    """(steps, copied): the step value of every optimizer state, and how many shared one."""
    import torch
    seen, copied, steps = set(), 0, []
    for state in getattr(optimizer, "state", {}).values():
        step = state.get("step") if isinstance(state, dict) else None
        if torch.is_tensor(step):
            if id(step) in seen:
                state["step"] = step = step.clone()
                copied += 1
            seen.add(id(step))
        if step is not None:
            steps.append(int(step))
    return steps, copied


def _mlaunch_wrap_universal_load(cls):
    load = cls._load_universal_checkpoint

    def _load_universal_checkpoint(self, checkpoint_folder, *args, **kwargs):
        out = load(self, checkpoint_folder, *args, **kwargs)
        steps, copied = _mlaunch_own_steps(self.optimizer)
        if os.environ.get("RANK", "0") == "0":
            import re
            tag = re.search(r"global_step(\d+)", os.path.basename(str(checkpoint_folder).rstrip("/")))
            saved = f"global step {tag.group(1)}" if tag else "its global step unknown"
            told = sorted(set(steps)) or "none"
            print(f"mlaunch: universal load of {checkpoint_folder} ({saved}): {cls.__name__} "
                  f"optimizer step {told} in {len(steps)} states; {copied} shared one step "
                  "tensor and got their own", flush=True)
        return out

    cls._load_universal_checkpoint = _load_universal_checkpoint


def _mlaunch_fix_universal_steps():
    import importlib
    for module, name in (("deepspeed.runtime.zero.stage3", "DeepSpeedZeroOptimizer_Stage3"),
                         ("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer"),
                         ("deepspeed.runtime.bf16_optimizer", "BF16_Optimizer")):
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):   # another DeepSpeed layout: nothing to wrap
            continue
        if hasattr(cls, "_load_universal_checkpoint"):
            _mlaunch_wrap_universal_load(cls)


_mlaunch_fix_universal_steps()
# ---------------------------------------------------------------------------------------------

_create_optimizer = transformers.Trainer.create_optimizer


def create_optimizer(self, *args, **kwargs):
    optimizer = _create_optimizer(self, *args, **kwargs)
    groups = getattr(optimizer, "param_groups", None)
    if getattr(self, "is_deepspeed_enabled", False) and isinstance(groups, list):
        kept = [g for g in groups if len(g["params"]) > 0]
        if os.environ.get("RANK", "0") == "0":
            lrs = ", ".join(f"lr {g.get('lr')} × {len(g['params'])} tensors" for g in kept)
            print(f"mlaunch: optimizer {type(optimizer).__name__}: {len(kept)} parameter groups "
                  f"({lrs}); {len(groups) - len(kept)} empty removed", flush=True)
        groups[:] = kept
    return optimizer


transformers.Trainer.create_optimizer = create_optimizer
sys.argv = ["llamafactory.launcher", *sys.argv[1:]]
runpy.run_module("llamafactory.launcher", run_name="__main__", alter_sys=True)

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
"""
import os
import runpy
import sys

import transformers

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

"""The minimal reproduction of DeepSpeed's shared optimizer step after a ZeRO universal load
(docs/upstream-zero3-universal-step.md), and the check of mlaunch's fix.

    torchrun --nproc_per_node 2 universal_step_repro.py save DIR STAGE     # 1, 2, 3, 2o, 3o
    python -m deepspeed.checkpoint.ds_to_universal --input_folder DIR/global_step3 \
        --output_folder DIR/global_step3_universal --inject_missing_state
    torchrun --nproc_per_node 1 universal_step_repro.py load DIR STAGE [--fix ENTRY]

A two-layer model in two parameter groups (decay / no-decay, as the HF Trainer makes them),
AdamW (DeepSpeedCPUAdam with the optimizer offloaded to the CPU: STAGE 2o, 3o), 3 steps at world 2, saved; loaded at world 1 through the universal checkpoint, then 2
more steps. Each rank prints one JSON line: every optimizer state's step after the load and
after the 2 steps ({"after_load": [...], "after_2_steps": [...]}); a correct loader gives
3s then 5s. --fix ENTRY: exec mlaunch's entry snippet (the rendered universal_steps part of
ENTRY) first, as mlaunch's entry does on the nodes. CPU and gloo: no GPU needed.
"""
import json
import os
import sys

import torch

mode, where, stage = sys.argv[1], sys.argv[2], sys.argv[3]   # STAGE: 1, 2, 3, or 2o / 3o (CPU offload)
offload = stage.endswith("o")
if "--fix" in sys.argv:
    text = open(sys.argv[sys.argv.index("--fix") + 1]).read()
    start, end = text.index("# --- mlaunch: each optimizer"), text.rindex("# -----")
    exec(compile(text[start:end], "universal_steps", "exec"), {"os": os, "__name__": "fix"})

import deepspeed  # noqa: E402  (after the fix, as on the nodes)

deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 1))
decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]
rest = [p for n, p in model.named_parameters() if not (n.endswith("weight") and p.dim() > 1)]
groups = [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}]
if offload:   # ZeRO-Offload steps the fp32 partitions with DeepSpeed's own CPU Adam
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    optimizer = DeepSpeedCPUAdam(groups, lr=1e-2)
else:
    optimizer = torch.optim.AdamW(groups, lr=1e-2)
zero = {"stage": int(stage.rstrip("o"))} | ({"offload_optimizer": {"device": "cpu"}} if offload else {})
config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
          "zero_optimization": zero, "zero_allow_untested_optimizer": True,
          "checkpoint": {"load_universal": mode == "load"}}
engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)


def step() -> None:
    x = torch.randn(2, 8)
    loss = engine(x).pow(2).mean()
    engine.backward(loss)
    engine.step()


def steps() -> list[int]:
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    return [int(s["step"]) for s in inner.state.values() if "step" in s]


if mode == "save":
    for _ in range(3):
        step()
    engine.save_checkpoint(where, tag="global_step3")
else:
    engine.load_checkpoint(where, tag="global_step3_universal")
    after_load = steps()
    step()
    step()
    print(json.dumps({"rank": int(os.environ.get("RANK", 0)), "after_load": after_load,
                      "after_2_steps": steps()}), flush=True)

# The process group ended, then the process, without the interpreter's teardown: its C++
# destructors, with a thread of the offloaded optimizer's still joinable, aborted a load
# (SIGABRT, "terminate called without an active exception") after its line was printed.
torch.distributed.destroy_process_group()
sys.stdout.flush()
os._exit(0)

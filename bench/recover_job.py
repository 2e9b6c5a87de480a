"""The recovery benchmark's job (bench/recovery.py): gloo, a step every 0.5 s. The first
launch steps until it is killed (rank 0 of each node says "ready" at step 3); a restart
(mlaunch's attempt tag, or torchrun's TORCHELASTIC_RESTART_COUNT) runs STEPS steps and exits 0.
Rank 0 prints each step as a dict with a wall-clock stamp, so the first step of the new world
is read from the output of any launcher. Args: STEPS."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

steps = int(sys.argv[1])
tag = os.environ.get("MLAUNCH_RUN_ID", "")
restarted = ("+a" in tag and not tag.endswith("+a0")) or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"world_size={world}", flush=True)
step = 0
while not restarted or step < steps:
    step += 1
    t = torch.ones(1)
    dist.all_reduce(t)
    if rank == 0:
        print(json.dumps({"step": step, "loss": round(1.0 / step, 4), "world": world,
                          "restarted": restarted, "wall": time.time()}), flush=True)
    if step == 3 and not restarted and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        print(f"ready rank {rank} pid {os.getpid()}", flush=True)
    time.sleep(0.5)
dist.destroy_process_group()

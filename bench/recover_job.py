"""The recovery benchmark's job (bench/recovery.py): gloo, a step every 0.5 s. The first
world of 4 steps until a node is killed (its rank 0 writes MARKER at step 3 and says "ready");
a world formed after that (MARKER there: mlaunch's next attempt, or torchrun elastic's new
world, whichever way it counts its restarts) runs STEPS steps and exits 0. Rank 0 prints each
step as a dict with a wall-clock stamp, so the first step of the new world is read from the
output of any launcher. Args: STEPS MARKER."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

steps, marker = int(sys.argv[1]), sys.argv[2]
restarted = os.path.exists(marker)
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
    if step == 3 and not restarted and world == 4:
        if rank == 0:
            open(marker, "w").close()
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            print(f"ready rank {rank} pid {os.getpid()}", flush=True)
    time.sleep(0.5)
dist.destroy_process_group()

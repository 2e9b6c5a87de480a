"""A tiny training job over gloo for the phase timeline: says the world it joined, then rank 0
logs a step dict per all-reduce. The first attempt holds after step HOLD (says "ready" and
sleeps: a node is cut meanwhile); a restart starts over at step 1 and runs to TOTAL.
Args: HOLD TOTAL."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

hold, total = int(sys.argv[1]), int(sys.argv[2])
tag = os.environ["MLAUNCH_RUN_ID"]
attempt = int(tag.rsplit("+a", 1)[1]) if "+a" in tag else 0
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"world_size={world}", flush=True)
for step in range(1, total + 1):
    t = torch.ones(1)
    dist.all_reduce(t)
    if rank == 0:
        print(json.dumps({"step": step, "loss": round(1.0 / step, 4)}), flush=True)
    if attempt == 0 and step == hold:
        print(f"ready rank {rank} pid {os.getpid()}", flush=True)
        time.sleep(3600)
    time.sleep(0.2)
dist.destroy_process_group()

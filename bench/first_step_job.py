"""The first-step benchmark's job (bench/first_step.py): gloo, STEPS all-reduce steps; rank 0
prints each step as a dict with a wall-clock stamp (its first: every rank has reached step 1).
Args: STEPS."""
import json
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"world_size={world}", flush=True)
for step in range(1, int(sys.argv[1]) + 1):
    t = torch.ones(1)
    dist.all_reduce(t)
    if rank == 0:
        print(json.dumps({"step": step, "loss": round(1.0 / step, 4), "wall": time.time()}), flush=True)
dist.destroy_process_group()

"""A script job for the health tests: logs steps like a trainer, then misbehaves on request.

--hang-rank R --hang-step S: rank R sleeps before step S's all-reduce, the others wait in it.
--nan-step S: rank 0 logs a NaN loss from step S on.
--lie-world N --lie-node K: ranks of node K print that they joined a world of N.
--stop-rank R --stop-step S: rank R stops itself (SIGSTOP) before step S's all-reduce.
"""
import argparse
import math
import os
import signal
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--hang-rank", type=int, default=-1)
p.add_argument("--hang-step", type=int, default=-1)
p.add_argument("--nan-step", type=int, default=-1)
p.add_argument("--lie-world", type=int, default=0)
p.add_argument("--lie-node", type=int, default=-1)
p.add_argument("--stop-rank", type=int, default=-1)
p.add_argument("--stop-step", type=int, default=-1)
p.add_argument("--step-s", type=float, default=0.3)
a = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
node = int(os.environ["MLAUNCH_NODE_RANK"])
shown = a.lie_world if node == a.lie_node else world
print(f"rank {rank}: world_size={shown}", flush=True)
for step in range(1, a.steps + 1):
    if rank == a.hang_rank and step == a.hang_step:
        time.sleep(3600)
    if rank == a.stop_rank and step == a.stop_step:
        os.kill(os.getpid(), signal.SIGSTOP)
    t = torch.ones(1)
    dist.all_reduce(t)
    loss = math.nan if 0 <= a.nan_step <= step else 1.0 / step
    if rank == 0:
        print({"step": step, "loss": loss, "sum": int(t.item())}, flush=True)
    time.sleep(a.step_s)
dist.destroy_process_group()

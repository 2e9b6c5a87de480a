"""mlaunch preflight all-reduce, started by torchrun on every node through mlaunch's fan-out.

1. A small all-reduce whose exact result every rank checks (gloo on CPU, NCCL with CUDA).
2. A timed all-reduce of --mb MB; rank 0 prints the bus bandwidth as nccl-tests defines it:
   algbw = bytes / time, busbw = algbw * 2 (n - 1) / n.
Prints "mlaunch-collective: ..." progress lines (so the launcher can tell how far each node
got) and, on rank 0, one "MLAUNCH-COLLECTIVE <json>" line. Exit 3 on a wrong result.
"""
import argparse
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--mb", type=float, default=64.0)
ap.add_argument("--iters", type=int, default=5)
ap.add_argument("--timeout", type=float, default=120.0)
args = ap.parse_args()

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
local = int(os.environ.get("LOCAL_RANK", "0"))
cuda = torch.cuda.is_available()
backend = "nccl" if cuda else "gloo"
dev = torch.device("cuda", local) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(dev)


def say(text):
    print("mlaunch-collective: rank %d/%d %s" % (rank, world, text), flush=True)


def sync():
    if cuda:
        torch.cuda.synchronize()


say("starting (%s)" % backend)
dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
say("joined")

# Correctness: element i of rank r is i + r, so the sum is exact in float32 for small i, r.
n = 4096
x = torch.arange(n, dtype=torch.float32, device=dev) + rank
dist.all_reduce(x)
want = torch.arange(n, dtype=torch.float32, device=dev) * world + world * (world - 1) / 2
mine_ok = bool(torch.equal(x, want))
bad = torch.tensor([0.0 if mine_ok else 1.0], device=dev)
dist.all_reduce(bad)
if bad.item() > 0:
    say("WRONG all-reduce result " + ("on this rank" if not mine_ok else "on another rank"))
    sys.exit(3)
say("all-reduce correct")

# Bandwidth: one warm-up (connections, algorithm choice), then the timed iterations.
elems = max(1, int(args.mb * 2 ** 20) // 4)
buf = torch.ones(elems, dtype=torch.float32, device=dev)
dist.all_reduce(buf)
sync()
t0 = time.perf_counter()
for _ in range(args.iters):
    dist.all_reduce(buf)
sync()
elapsed = torch.tensor([(time.perf_counter() - t0) / args.iters], dtype=torch.float64, device=dev)
dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)   # the slowest rank is the collective's time
seconds = elapsed.item()
algbw = elems * 4 / seconds / 1e9
busbw = algbw * 2 * (world - 1) / world
if rank == 0:
    print("MLAUNCH-COLLECTIVE " + json.dumps({
        "ok": True, "world": world, "backend": backend, "mb": elems * 4 / 2 ** 20,
        "seconds": seconds, "algbw_gbps": algbw, "busbw_gbps": busbw}), flush=True)
dist.destroy_process_group()

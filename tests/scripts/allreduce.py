"""All-reduce each rank's number over gloo and print the sum every rank sees."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank)])
dist.all_reduce(t)
print(f"rank {rank}/{world} node {os.environ['GROUP_RANK']} sum {int(t.item())} "
      f"expected {world * (world - 1) // 2} devices {os.environ.get('CUDA_VISIBLE_DEVICES', '-')}",
      flush=True)
dist.destroy_process_group()

"""Says where each rank runs and in which attempt; the first attempt sleeps (a node's link is
cut meanwhile), a restart writes a marker under output_dir and exits 0. Args: OUTPUT_DIR
[ECC_NODE]: in the first attempt, node ECC_NODE's rank fails as a GPU with an uncorrectable
ECC error makes PyTorch fail (its message, exit 1) instead of sleeping."""
import os
import socket
import sys
import time

rank, node = int(os.environ["RANK"]), os.environ["MLAUNCH_NODE_RANK"]
tag = os.environ["MLAUNCH_RUN_ID"]
attempt = int(tag.rsplit("+a", 1)[1]) if "+a" in tag else 0
print(f"ready rank {rank} pid {os.getpid()}", flush=True)
print(f"where rank {rank}/{os.environ['WORLD_SIZE']} node {node} host {socket.gethostname()} "
      f"attempt {attempt}", flush=True)
if attempt == 0 and sys.argv[2:] == [node]:
    print("RuntimeError: CUDA error: uncorrectable ECC error encountered", file=sys.stderr, flush=True)
    sys.exit(1)
if attempt == 0:
    time.sleep(3600)
with open(os.path.join(sys.argv[1], f"done-rank{rank}-attempt{attempt}"), "w") as fh:
    fh.write(socket.gethostname())

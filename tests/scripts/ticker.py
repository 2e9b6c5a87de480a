"""Every rank prints N numbered lines, INTERVAL_S apart, each with the wall time it was
written; then rank 0 exits with EXIT_CODE and the others with 0. Args: N INTERVAL_S EXIT_CODE."""
import os
import sys
import time

n, interval, code = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
rank = int(os.environ["RANK"])
for i in range(n):
    print(f"tick rank {rank} node {os.environ.get('MLAUNCH_NODE_RANK')} i {i} t {time.time():.6f}", flush=True)
    time.sleep(interval)
print(f"done rank {rank}", flush=True)
sys.exit(code if rank == 0 else 0)

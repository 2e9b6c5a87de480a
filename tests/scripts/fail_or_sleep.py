"""One chosen rank exits with a code after a delay; every other rank sleeps (no sockets).

torchrun alone would wait for the sleepers forever: only a launcher that tears the job down
ends it. Args: FAIL_RANK EXIT_CODE DELAY_S (FAIL_RANK -1: nobody fails).
"""
import os
import sys
import time

fail_rank, code, delay = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
rank = int(os.environ["RANK"])
print(f"ready rank {rank} pid {os.getpid()}", flush=True)
if rank == fail_rank:
    time.sleep(delay)
    print(f"rank {rank} exiting {code}", flush=True)
    sys.exit(code)
time.sleep(3600)

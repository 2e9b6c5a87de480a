"""Prints the canary secrets it was given, says it is ready, then waits for the file argv[1]."""
import os
import sys
import time

rank = os.environ.get("RANK", "0")
print(f"rank {rank} db {os.environ['DB_URL']} short {os.environ['SHORT']}", flush=True)
print(f"ready rank {rank} pid {os.getpid()}", flush=True)
while not os.path.exists(sys.argv[1]):   # the test's go-ahead, not a timed wait
    time.sleep(0.1)

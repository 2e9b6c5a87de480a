"""Rank 0 logs N training steps the way the HF Trainer does, INTERVAL_S apart; every rank
then exits 0. Args: N INTERVAL_S."""
import os
import sys
import time

n, interval = int(sys.argv[1]), float(sys.argv[2])
for i in range(1, n + 1):
    time.sleep(interval)
    if int(os.environ.get("RANK", "0")) == 0:
        print({"loss": round(2.0 / i, 4), "learning_rate": 1e-4, "epoch": round(i / n, 2),
               "global_step/max_steps": f"{i}/{n}"}, flush=True)

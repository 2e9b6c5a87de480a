"""Stand-in for `python -m llamafactory.launcher JOB.yaml` (tests only, no training): reads the
YAML mlaunch rendered and says the batch each rank would train with, then behaves as
tests/scripts/spare_job.py does: the first attempt sleeps (a node is lost meanwhile), a
restart writes done-rank<R>-attempt<N> (its host) under the YAML's output_dir and exits 0."""
import os
import socket
import sys
import time

import yaml

args = yaml.safe_load(open(sys.argv[1]))
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
tag = os.environ["MLAUNCH_RUN_ID"]
attempt = int(tag.rsplit("+a", 1)[1]) if "+a" in tag else 0
per_device, accum = args["per_device_train_batch_size"], args["gradient_accumulation_steps"]
print(f"ready rank {rank} pid {os.getpid()}", flush=True)
print(f"batch rank {rank}/{world} host {socket.gethostname()} attempt {attempt}: global "
      f"{world * per_device * accum} = {world} × {per_device} × {accum}", flush=True)
if attempt == 0:
    time.sleep(3600)
with open(os.path.join(args["output_dir"], f"done-rank{rank}-attempt{attempt}"), "w") as fh:
    fh.write(socket.gethostname())

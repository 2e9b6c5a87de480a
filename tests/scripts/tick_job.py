"""Says it is ready, then a line a second for an hour in the first attempt (a node is frozen
or killed meanwhile); a restart writes a marker under output_dir and exits 0. Args: OUTPUT_DIR."""
import os
import socket
import sys
import time

rank = int(os.environ["RANK"])
tag = os.environ["MLAUNCH_RUN_ID"]
attempt = int(tag.rsplit("+a", 1)[1]) if "+a" in tag else 0
print(f"ready rank {rank} pid {os.getpid()} attempt {attempt}", flush=True)
if attempt == 0:
    for i in range(3600):
        print(f"tick rank {rank} i {i}", flush=True)
        time.sleep(1)
with open(os.path.join(sys.argv[1], f"done-rank{rank}-attempt{attempt}"), "w") as fh:
    fh.write(socket.gethostname())

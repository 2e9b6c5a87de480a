"""Proves a rank sees HF_TOKEN without printing it; the first attempt fails (restart test).

Args: MARKER_DIR SECONDS. Each rank prints the sha256 of its HF_TOKEN, stays alive for
SECONDS (so that a process-list sampler sees the whole job), then attempt 0 exits 3 and
later attempts exit 0. The attempt is read from MLAUNCH_RUN_ID (RUN for attempt 0, RUN+a<N>
after), not from marker files: a rank that torchrun ends when the other rank fails never
writes one, and its retry would fail again. MARKER_DIR gets a file per rank and attempt.
"""
import hashlib
import os
import sys
import time

marker_dir, seconds = sys.argv[1], float(sys.argv[2])
rank = int(os.environ["RANK"])
digest = hashlib.sha256(os.environ.get("HF_TOKEN", "").encode()).hexdigest()
print(f"rank {rank} HF_TOKEN sha256 {digest}", flush=True)
time.sleep(seconds)
run_id = os.environ["MLAUNCH_RUN_ID"]
attempt = int(run_id.rsplit("+a", 1)[1]) if "+a" in run_id else 0
open(os.path.join(marker_dir, f"attempt-{attempt}-{os.environ['MLAUNCH_NODE_RANK']}-{rank}"), "w").close()
if attempt == 0:
    print(f"rank {rank} failing on purpose", flush=True)
    sys.exit(3)
print(f"rank {rank} done", flush=True)

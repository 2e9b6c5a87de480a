"""Proves a rank sees HF_TOKEN without printing it; the first attempt fails (restart test).

Args: MARKER_DIR SECONDS. Each rank prints the sha256 of its HF_TOKEN, stays alive for
SECONDS (so that a process-list sampler sees the whole job), then attempt 0 (no marker
file yet) exits 3 and later attempts exit 0.
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
marker = os.path.join(marker_dir, f"attempted-{os.environ['MLAUNCH_NODE_RANK']}-{rank}")
if not os.path.exists(marker):
    open(marker, "w").close()
    print(f"rank {rank} failing on purpose", flush=True)
    sys.exit(3)
print(f"rank {rank} done", flush=True)

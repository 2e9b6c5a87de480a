"""A rank that shows what it sees inside a container without printing a secret.

Args: MARKER_DIR. Prints the sha256 of its HF_TOKEN and whether it runs in a podman container
(/run/.containerenv), writes MARKER_DIR/started-<rank>, then waits until MARKER_DIR/release
exists (never, for a test that ends the run another way) and exits 0.
"""
import hashlib
import os
import sys
import time

marker_dir = sys.argv[1]
rank = int(os.environ["RANK"])
digest = hashlib.sha256(os.environ.get("HF_TOKEN", "").encode()).hexdigest()
inside = "yes" if os.path.exists("/run/.containerenv") else "no"
print(f"rank {rank} HF_TOKEN sha256 {digest} in container {inside}", flush=True)
open(os.path.join(marker_dir, f"started-{rank}"), "w").close()
while not os.path.exists(os.path.join(marker_dir, "release")):
    time.sleep(0.1)
print(f"rank {rank} released", flush=True)

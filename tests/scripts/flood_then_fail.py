"""Rank 0 prints numbered 1 KB lines as fast as it can, forever; rank 1 exits 1 once MARKER
exists. Rank 0 creates MARKER itself after AFTER lines, so a backlog has built. MARKER "-":
rank 0 prints AFTER lines and exits 0.

Args: MARKER AFTER. Each of rank 0's lines is "%09d " and a fixed 1014-byte payload.
"""
import os
import sys
import time

marker, after = sys.argv[1], int(sys.argv[2])
rank = int(os.environ["RANK"])
PAYLOAD = "x" * 1014
print(f"ready rank {rank} pid {os.getpid()}", flush=True)
if rank == 1:
    while not os.path.exists(marker):
        time.sleep(0.02)
    print("rank 1 exiting 1", flush=True)
    sys.exit(1)
w, i = sys.stdout.write, 0
while True:
    w("%09d %s\n" % (i, PAYLOAD))
    i += 1
    if i == after and marker == "-":
        sys.exit(0)
    if i == after:
        sys.stdout.flush()
        open(marker, "w").close()

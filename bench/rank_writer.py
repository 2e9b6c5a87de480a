"""A rank that prints numbered 100-byte lines as fast as it can, forever, and appends
"<time> <lines>" to RATE_FILE every 0.2 s, so a bench sees its own write rate."""
import os
import sys
import time

w, out, i = sys.stdout.write, open(os.environ["RATE_FILE"], "a", buffering=1), 0
payload, mark = "x" * 89, time.time()
while True:
    for _ in range(1000):
        w("%09d %s\n" % (i, payload))
        i += 1
    if (now := time.time()) - mark >= 0.2:
        out.write(f"{now!r} {i}\n")
        mark = now

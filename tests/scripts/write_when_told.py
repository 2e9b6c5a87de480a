"""Creates READY, waits until GO exists, prints LINES numbered 1 KB lines as fast as it can,
creates DONE (every line written), exits 0: a rank whose writes a test can time against a
stopped launcher.

Args: READY GO DONE LINES. Each line is "%09d " and a fixed 1014-byte payload (the format of
flood_then_fail.py)."""
import os
import sys
import time

ready, go, done, lines = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
PAYLOAD = "x" * 1014
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.02)
w = sys.stdout.write
for i in range(lines):
    w("%09d %s\n" % (i, PAYLOAD))
sys.stdout.flush()
open(done, "w").close()

"""Like tests/scripts/fail_or_sleep.py, but the failing rank records its exit time first."""
import os
import sys
import time

fail_rank, code, delay = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
if int(os.environ["RANK"]) == fail_rank:
    time.sleep(delay)
    with open(os.environ["EXIT_STAMP"], "w") as fh:
        fh.write(repr(time.time()))
    os._exit(code)
time.sleep(3600)

"""Prints what the spliced log path must carry (tests/test_relay.py): the secret in HF_TOKEN,
a progress bar's frames, a loss dict, then LINES numbered lines; exits 0.

Args: LINES."""
import os
import sys

lines = int(sys.argv[1])
rank = os.environ["RANK"]
print(f"rank {rank} token {os.environ['HF_TOKEN']}", flush=True)
print(f"rank {rank} frame one\rframe two", flush=True)
print("{'loss': 1.25, 'epoch': 0.5}", flush=True)
w = sys.stdout.write
for i in range(lines):
    w("%09d %s\n" % (i, "y" * 90))
sys.stdout.flush()

"""Prints `waiting for PATH`, waits until PATH exists, exits 0 (a trainer the test releases)."""
import os
import sys
import time

path = sys.argv[1]
print(f"waiting for {path}", flush=True)
while not os.path.exists(path):
    time.sleep(0.05)
print("released", flush=True)

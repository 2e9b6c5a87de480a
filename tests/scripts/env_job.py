"""Prints, per rank, the environment values the env/setup tests set, as one JSON line."""
import json
import os

names = ("MLAUNCH_T_PATH", "LD_LIBRARY_PATH", "MLAUNCH_T_DOLLAR", "MLAUNCH_T_SETUP")
print("env " + json.dumps({"rank": os.environ.get("RANK"), **{n: os.environ.get(n) for n in names}}),
      flush=True)

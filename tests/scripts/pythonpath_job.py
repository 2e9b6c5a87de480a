"""Prints the PYTHONPATH the rank was started with (`pythonpath <value>`, `-` for none)."""
import os

print("pythonpath " + os.environ.get("PYTHONPATH", "-"), flush=True)

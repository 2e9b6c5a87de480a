"""A job that reads staged files on its node: prints `staged <hostname> <rank> <path> <sha256>`
for each path in argv; exits 3 when one is missing there."""
import hashlib
import os
import socket
import sys

for path in sys.argv[1:]:
    if not os.path.isfile(path):
        print(f"missing {socket.gethostname()} {path}", flush=True)
        sys.exit(3)
    with open(path, "rb") as f:
        print(f"staged {socket.gethostname()} {os.environ.get('RANK')} {path} "
              f"{hashlib.sha256(f.read()).hexdigest()}", flush=True)

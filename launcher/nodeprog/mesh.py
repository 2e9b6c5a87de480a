# mlaunch preflight mesh: the mesh's second round (launcher/preflight/network.py settle_mesh);
# the first runs inside the facts probe. One JSON line: what each listener and dialer saw.
# Standard library only; Python >= 3.6. Its parts (ports, meshnet) are inlined when shipped.
import json
import os
import sys

from .ports import bind, holder
from .meshnet import run_mesh

P = json.loads(sys.argv[1])
sys.stdout.write(P["marker"] + " " + json.dumps(run_mesh(P, bind, holder)) + "\n")
sys.stdout.flush()
os._exit(0)   # do not wait for a thread stuck in the kernel

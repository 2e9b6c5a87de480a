"""Checkpoint parts on hosts that share no disk (issue 54): what this node holds of each
checkpoint of output_dir, and retention over it.

Standard library only, no imports from ``launcher``: shipped by ``nodeprog.script`` and run as
``python3 - MODE ARGS``. A node's *part* of ``checkpoint-N`` is what its ranks wrote there (each
rank's optimizer shard, its rng_state; node 0 also the weights and trainer_state.json). A part
is complete once every rank of the node wrote its rng_state (the HF Trainer saves it last of
the rank's own files); the checkpoint is complete once node 0's trainer_state.json is there too.
Copies of other nodes' parts live in ``OUTPUT_DIR/.mlaunch-replicas/checkpoint-N/part<R>``
(R: the lowest global rank of the part), each with its manifest beside it.

Modes:

* ``inventory OUTPUT_DIR RANKS_JSON WORLD``: one JSON object: {"own": {N: {"complete", "ranks",
  "state"}}, "replicas": {N: {R: [ranks]}}}: the checkpoints this node's ranks (RANKS_JSON)
  wrote, whether its part is complete, whether trainer_state.json is there and the ranks whose
  rng_state it holds; and the parts of other nodes it holds a sealed copy of, with their ranks.
* ``prune OUTPUT_DIR KEEP_JSON``: every checkpoint-N and replica not in KEEP_JSON (a list of N)
  removed, never the newest complete one a copy of which the launcher names there; prints the
  removed names as JSON.
"""
import json
import os
import re
import shutil
import sys

REPLICAS = ".mlaunch-replicas"
MANIFEST = ".mlaunch-manifest"
CKPT = re.compile(r"^checkpoint-(\d+)$")
PART = re.compile(r"^part(\d+)$")


def rng_files(ranks, world):
    """The rng_state files these global ranks write (rng_state.pth alone at world 1)."""
    return ["rng_state.pth"] if world <= 1 else ["rng_state_%d.pth" % r for r in ranks]


def inventory(out, ranks, world):
    own, reps = {}, {}
    for name in _names(out):
        m = CKPT.match(name)
        if not m:
            continue
        path = os.path.join(out, name)
        have = set(_names(path))
        own[m.group(1)] = {"complete": all(f in have for f in rng_files(ranks, world)),
                           "state": "trainer_state.json" in have,
                           "ranks": sorted(int(f[10:-4]) for f in have if re.match(r"^rng_state_\d+\.pth$", f))}
    base = os.path.join(out, REPLICAS)
    for name in _names(base):
        m = CKPT.match(name)
        if not m:
            continue
        parts = {}
        for p in _names(os.path.join(base, name)):
            if PART.match(p) and os.path.isfile(os.path.join(base, name, p + MANIFEST)):
                parts[PART.match(p).group(1)] = sorted(
                    int(f[10:-4]) for f in _names(os.path.join(base, name, p))
                    if re.match(r"^rng_state_\d+\.pth$", f)) or [0]
        if parts:
            reps[m.group(1)] = parts
    return {"own": own, "replicas": reps}


def prune(out, keep):
    """Every checkpoint-N (own, and copies of others' parts) whose N is not in keep removed."""
    keep, gone = {str(k) for k in keep}, []
    for root in (out, os.path.join(out, REPLICAS)):
        for name in _names(root):
            m = CKPT.match(name)
            if m and m.group(1) not in keep:
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
                gone.append(os.path.relpath(os.path.join(root, name), out))
    return gone


def _names(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[0] == "inventory":
        print(json.dumps(inventory(argv[1], json.loads(argv[2]), int(argv[3]))))
        return 0
    if argv[0] == "prune":
        print(json.dumps(prune(argv[1], json.loads(argv[2]))))
        return 0
    print("mlaunch: replicas: unknown mode %r" % argv[0], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""What llamafactory-cli's launch environment changes (issue 12): the same LoRA job through
mlaunch with its LLaMA-Factory defaults (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,
TORCH_NCCL_AVOID_RECORD_STREAMS=1) against cluster.env setting torch's own defaults back
(expandable_segments:False, TORCH_NCCL_AVOID_RECORD_STREAMS=0), alternating.

Usage, from the repo root of a GPU machine with LLaMA-Factory (one H200 is enough; with one
GPU only the allocator setting can matter, NCCL streams need 2):
    python3 bench/lf_env.py OUTDIR [--gpus 1] [--runs 3] [--steps 150] [--per-device 32] [--wheels DIR]
--cpu rehearses on CPU with the tiny test model (it checks this script, not the figures).
Each run appends one JSON line to OUTDIR/results.jsonl (samples/s, steady samples/s, peak MiB
per GPU); the end prints the medians and the ratio defaults / torch-defaults.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_proof as gp  # noqa: E402  (Setup, spec, train, mlaunch, install: one way to run a job)

TORCH_DEFAULTS = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False", "TORCH_NCCL_AVOID_RECORD_STREAMS": "0"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--per-device", type=int, default=32)
    gp.machine_args(ap)
    a = ap.parse_args()
    s = gp.prepare(a.out, a.wheels, a.cpu, a.per_device)
    steps = 12 if a.cpu else a.steps
    kinds = {"lf-env": gp.spec(s, "lfenv-on", steps=steps, gpus=a.gpus)}
    s.env = {**s.env, **TORCH_DEFAULTS}
    kinds["torch-defaults"] = gp.spec(s, "lfenv-off", steps=steps, gpus=a.gpus)
    for path in kinds.values():   # a port of its own: 29500 may be another job's
        job = json.load(open(path))
        job["cluster"]["master_port"] = free_port()
        json.dump(job, open(path, "w"), indent=1)
    recs: dict[str, list[dict]] = {k: [] for k in kinds}
    for i in range(a.runs):
        for kind, path in kinds.items():
            out_dir = json.load(open(path))["output_dir"]
            recs[kind].append(gp.train(s, a.out, "lfenv", kind, i, gp.mlaunch("submit", path), out_dir,
                                       a.gpus * s.per_device, gpus=a.gpus))
    print(summary(recs))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def summary(recs: dict[str, list[dict]]) -> str:
    """Medians per kind and the ratio of the LLaMA-Factory defaults to torch's."""
    def med(kind: str, key: str):
        vals = [r[key] for r in recs[kind] if r.get("rc") == 0 and r.get(key) is not None]
        return statistics.median(vals) if vals else None
    lines = ["kind             samples/s  steady  peak MiB (per GPU)"]
    for kind in recs:
        peaks = [r["peak_mib"] for r in recs[kind] if r.get("peak_mib")]
        lines.append(f"{kind:<16} {med(kind, 'samples_per_s')}  {med(kind, 'steady_samples_per_s')}  "
                     f"{peaks[-1] if peaks else None}")
    on, off = med("lf-env", "samples_per_s"), med("torch-defaults", "samples_per_s")
    if on and off:
        lines.append(f"ratio lf-env / torch-defaults: {on / off:.3f} (n={len(recs['lf-env'])})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

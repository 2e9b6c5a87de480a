"""The launcher side's CPU in a first-step run, split: mlaunch's own Python process against its
children (the ssh clients and local helpers), and its own CPU over time (sampled every 0.5 s
from a thread of the launcher's process). Same hosts and job as bench/first_step.py, which
measures the launcher side as one figure against pdsh's.

  python bench/launcher_cpu_split.py --hosts 8 --runs 3
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.first_step import JOB, first_step  # noqa: E402
from bench.scale import WRAP as SCALE_WRAP  # noqa: E402
from tests.helpers import script_job, write_spec  # noqa: E402
from tests.hosts import make_hosts  # noqa: E402

# bench/scale.py's wrapper (its RUSAGE line at exit: the launcher's own CPU and its children's),
# with a thread ahead of it that reports the launcher's own CPU every 0.5 s.
WRAP = ("import os, sys, threading, time\n"
        "t0 = time.monotonic()\n"
        "def sample():\n"
        "    while True:\n"
        "        time.sleep(0.5)\n"
        "        sys.stderr.write('T %.1f %.3f\\n' % (time.monotonic() - t0, sum(os.times()[:2])))\n"
        "threading.Thread(target=sample, daemon=True).start()\n") + SCALE_WRAP


def one(hs, n: int, tmp: str, preflight: bool) -> str:
    out = os.path.join(tmp, f"out-{time.time_ns()}")
    spec = script_job([h.ip for h in hs.hosts[:n]], 1, "steps.py", ["3"], out, hs=hs) | {"name": "first-step"}
    spec["script"]["path"] = JOB
    env = {**os.environ, "PYTHONPATH": ROOT, "MLAUNCH_HOME": os.path.join(tmp, "home")}
    argv = [sys.executable, "-c", WRAP, "submit", write_spec(tmp, spec)] + ([] if preflight else ["--no-preflight"])
    t0 = time.time()
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    if r.returncode != 0:
        raise RuntimeError(f"mlaunch exit {r.returncode}: {r.stdout[-2000:]} {r.stderr[-2000:]}")
    usage = json.loads(r.stderr.rsplit("RUSAGE ", 1)[1].splitlines()[0])
    curve = [tuple(map(float, ln.split()[1:])) for ln in r.stderr.splitlines() if ln.startswith("T ")]
    early = next((c for t, c in curve if t >= 1.0), None)
    return (f"first step {first_step(r.stdout, t0):5.2f} s; launcher's own CPU {usage['self']:.3f} s "
            f"({early if early is not None else float('nan'):.3f} s by 1.0 s after its start); "
            f"its children's {usage['children']:.3f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print(f"{args.hosts} hosts, 1 process each; {args.runs} runs per variant, alternating")
    with tempfile.TemporaryDirectory() as tmp, make_hosts(args.hosts, isolated_home=True) as hs:
        for i in range(args.runs):
            for preflight in (True, False):
                print(f"run {i} {'mlaunch' if preflight else 'nopre':8s} {one(hs, args.hosts, tmp, preflight)}",
                      flush=True)
                time.sleep(2)


if __name__ == "__main__":
    main()

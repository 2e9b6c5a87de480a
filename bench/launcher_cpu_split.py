"""The launcher side's CPU in a first-step run, split: mlaunch's own Python process against its
children (the ssh clients and local helpers), and its own CPU over time (sampled every 0.5 s
from a thread of the launcher's process). Same hosts and job as bench/first_step.py, which
measures the launcher side as one figure against pdsh's.

  python bench/launcher_cpu_split.py --hosts 8 --runs 3
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.first_step import JOB, first_step  # noqa: E402
from tests.helpers import script_job, write_spec  # noqa: E402
from tests.hosts import make_hosts  # noqa: E402

# The launcher, run in-process with two reports on stderr: its own CPU every 0.5 s, and at exit
# os.times()'s (user, system, children's user, children's system).
WRAP = ("import atexit, os, runpy, sys, threading, time\n"
        "t0 = time.monotonic()\n"
        "def sample():\n"
        "    while True:\n"
        "        time.sleep(0.5)\n"
        "        sys.stderr.write('T %.1f %.3f\\n' % (time.monotonic() - t0, sum(os.times()[:2])))\n"
        "threading.Thread(target=sample, daemon=True).start()\n"
        "atexit.register(lambda: sys.stderr.write('SELF %.3f %.3f %.3f %.3f\\n' % os.times()[:4]))\n"
        "sys.argv = ['mlaunch'] + sys.argv[1:]\n"
        "runpy.run_module('launcher.cli', run_name='__main__')\n")


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
    lines = r.stderr.splitlines()
    user, system, cuser, csystem = map(float, next(ln for ln in lines if ln.startswith("SELF ")).split()[1:])
    curve = [tuple(map(float, ln.split()[1:])) for ln in lines if ln.startswith("T ")]
    early = next((c for t, c in curve if t >= 1.0), None)
    return (f"first step {first_step(r.stdout, t0):5.2f} s; launcher's own CPU {user + system:.3f} s "
            f"({early if early is not None else float('nan'):.3f} s by 1.0 s after its start); "
            f"its children's {cuser + csystem:.3f} s")


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

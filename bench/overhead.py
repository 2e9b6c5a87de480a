"""Launcher overhead on localhost: the quickstart job through `mlaunch submit` vs the same
rendered LLaMA-Factory YAML through `torchrun -m llamafactory.launcher` by hand.

Alternates the two, --runs each (default 3); prints medians and the ratio. Needs the
quickstart environment (./quickstart.sh once).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = os.path.join(ROOT, "configs", "quickstart.yaml")
VENV_BIN = os.path.join(ROOT, ".venvs", "trainer", "bin")


def timed(argv: list[str], env: dict | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, **(env or {})})
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    out = os.path.join(ROOT, ".quickstart", "output")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["mlaunch", "render", SPEC, "--out", tmp, "--run-id", "byhand"], check=True,
                       cwd=ROOT, stdout=subprocess.DEVNULL)
        by_hand_cmd = [os.path.join(VENV_BIN, "torchrun"), "--nnodes", "1", "--nproc-per-node", "2",
                       "-m", "llamafactory.launcher", os.path.join(tmp, "llamafactory.yaml")]
        ours_cmd = ["mlaunch", "submit", SPEC, "--overwrite", "--no-preflight"]
        ours, hand = [], []
        for _ in range(args.runs):
            shutil.rmtree(out, ignore_errors=True)
            ours.append(timed(ours_cmd))
            shutil.rmtree(out, ignore_errors=True)
            hand.append(timed(by_hand_cmd, {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}))
    m, h = statistics.median(ours), statistics.median(hand)
    print(f"mlaunch submit: median {m:.2f}s {[round(x, 2) for x in ours]}")
    print(f"torchrun by hand: median {h:.2f}s {[round(x, 2) for x in hand]}")
    print(f"ratio mlaunch / by hand: {m / h:.3f}")


if __name__ == "__main__":
    main()

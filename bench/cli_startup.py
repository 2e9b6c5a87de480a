"""Wall time of `mlaunch --help` and `mlaunch submit --dry-run` on a generated 64-node spec.

Usage: python bench/cli_startup.py [--runs N]. Prints medians; the goals: <= 0.25 s each, and the
dry run within 3x of importing its libraries (pydantic, jinja2, yaml, click).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

LIBS = "import pydantic, jinja2, yaml, click"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spec_64(path: str) -> None:
    with open(os.path.join(ROOT, "configs", "seed000-qwen2-7b-lora.yaml")) as fh:
        data = yaml.safe_load(fh)
    data["cluster"]["hosts"] = [f"10.20.{i // 250}.{i % 250 + 1}" for i in range(64)]
    data["cluster"]["master_addr"] = data["cluster"]["hosts"][0]
    data["batch"]["global"] = 64 * 4 * 2 * 8
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh)


def timed(argv: list[str], runs: int, env: dict | None = None) -> list[float]:
    """Wall seconds of each of `runs` runs of argv (output discarded)."""
    # The seed spec names ${HF_TOKEN}: a dry run refuses a secret this shell lacks.
    env = {"HF_TOKEN": "hf_bench", **(env or os.environ)}
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()
    exe = shutil.which("mlaunch") or sys.exit("mlaunch is not installed (pip install -e .)")
    with tempfile.TemporaryDirectory() as tmp:
        spec = os.path.join(tmp, "job64.yaml")
        spec_64(spec)
        cases = {"python -c pass (floor)": [sys.executable, "-c", "pass"],
                 LIBS: [sys.executable, "-c", "import pydantic, jinja2, yaml, click"],
                 "mlaunch --help": [exe, "--help"],
                 "mlaunch submit --dry-run (64 nodes)": [exe, "submit", spec, "--dry-run"]}
        med = {}
        for name, argv in cases.items():
            timed(argv, 1)  # warm the page cache (and mlaunch's compiled-template cache)
            t = timed(argv, args.runs)
            med[name] = statistics.median(t)
            print(f"{name:40s} median {med[name]:.3f}s  min {min(t):.3f}s  (n={len(t)})")
        ratio = med["mlaunch submit --dry-run (64 nodes)"] / med[LIBS]
        print(f"dry run / its libraries' import: {ratio:.2f}x (goal <= 3x)")


if __name__ == "__main__":
    main()

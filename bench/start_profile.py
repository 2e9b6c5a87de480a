"""Where the launcher's own start goes (issue 57: "the launcher's own start", from the process's
start to its connect mark, 0.30 s here against 0.49-0.51 s on the GPU machine): the interpreter,
the libraries, and `mlaunch submit --dry-run` of the first-step benchmark's job (a torchrun
script job on N hosts; a dry run connects nowhere), each as the median of --runs; then one
dry run under -X importtime (the modules costing the most by themselves) and one under
cProfile (mlaunch's own functions by cumulative time).

  python bench/start_profile.py [--hosts 8] [--runs 7]
"""
from __future__ import annotations

import argparse
import os
import pstats
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.cli_startup import timed  # noqa: E402
from tests.helpers import script_job, write_spec  # noqa: E402

LIBS = "import pydantic, jinja2, yaml, click"


def import_top(argv: list[str], env: dict, keep: int) -> list[str]:
    """The modules that cost the most by themselves (-X importtime's self column)."""
    r = subprocess.run([sys.executable, "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True)
    rows = []
    for line in r.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "self" not in line:
            own, cum, name = line[len("import time:"):].split("|")
            rows.append((int(own), int(cum), name.strip()))
    top = sorted(rows, reverse=True)[:keep]
    total = sum(r[0] for r in rows)
    return [f"all imports: {total / 1e6:.3f} s by themselves, {len(rows)} modules"] + [
        f"  {own / 1e6:.4f} s self, {cum / 1e6:.4f} s cumulative  {name}" for own, cum, name in top]


def profile_top(argv: list[str], env: dict, keep: int, tmp: str) -> list[str]:
    """mlaunch's own functions by cumulative time, one dry run under cProfile."""
    out = os.path.join(tmp, "prof")
    subprocess.run([sys.executable, "-m", "cProfile", "-o", out, *argv[1:]], env=env, check=True,
                   capture_output=True)
    stats = pstats.Stats(out)
    rows = [(v[3], v[1], f"{os.path.relpath(k[0], ROOT)}:{k[1]}({k[2]})")
            for k, v in stats.stats.items() if "/launcher/" in k[0]]
    return [f"  {cum:.4f} s cumulative, {calls} calls  {where}" for cum, calls, where in sorted(rows, reverse=True)[:keep]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        hosts = [f"10.30.{i // 250}.{i % 250 + 1}" for i in range(args.hosts)]
        spec = script_job(hosts, 1, "steps.py", ["3"], os.path.join(tmp, "out")) | {"name": "first-step"}
        dry = [sys.executable, "-m", "launcher.cli", "submit", write_spec(tmp, spec), "--dry-run"]
        path = [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "MLAUNCH_HOME": os.path.join(tmp, "home")}
        print(f"python {sys.version.split()[0]} at {sys.executable}; {os.cpu_count()} cores; "
              f"{args.hosts} hosts, {args.runs} runs each")
        for name, argv in {"python -c pass": [sys.executable, "-c", "pass"],
                           "python -S -c pass (no site)": [sys.executable, "-S", "-c", "pass"],
                           LIBS: [sys.executable, "-c", LIBS],
                           f"mlaunch submit --dry-run ({args.hosts} hosts)": dry}.items():
            timed(argv, 1, env)   # pyc files, page cache
            t = timed(argv, args.runs, env)
            print(f"{name:45s} median {statistics.median(t):.3f} s  ({min(t):.3f}-{max(t):.3f})")
        print("\n".join(import_top(dry, env, 15)))
        print("mlaunch's own functions (cProfile, cumulative):")
        print("\n".join(profile_top(dry, env, 25, tmp)))


if __name__ == "__main__":
    main()

"""Where the launcher's own start goes: the interpreter, its imports, and the dry run of an
8-host script job (spec validated, plan rendered, nothing connected), each timed as a fresh
process, with the imports grouped by top-level package from `python -X importtime`.

Issue 57: before it connects, mlaunch spends its start on the critical path of time to first
step (bench/first_step.py's "launcher's own start"); this says what that start is made of on
the machine it runs on.

    python bench/launcher_start.py [--runs 7]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# the test suite's script job, as bench/first_step.py writes it
from tests.helpers import script_job, write_spec  # noqa: E402


def timed(argv: list[str], runs: int, env: dict) -> list[float]:
    """Wall seconds of each of `runs` fresh processes of argv."""
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
        out.append(time.perf_counter() - t0)
    return out


def import_groups(argv: list[str], env: dict) -> dict[str, float]:
    """Self import time (s) by top-level package, from one `-X importtime` run of argv."""
    r = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, env=env, cwd=ROOT)
    groups: dict[str, float] = defaultdict(float)
    for line in r.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "self" not in line:
            own, _, name = line[len("import time:"):].split("|")
            groups[name.strip().split(".")[0]] += int(own) / 1e6
    return groups


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(ROOT, "launcher")],
                   check=True, stdout=subprocess.DEVNULL)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
    with tempfile.TemporaryDirectory() as tmp:
        spec = write_spec(tmp, script_job([f"10.9.0.{i}" for i in range(1, 9)], 1, "steps.py", ["3"],
                                          os.path.join(tmp, "out")) | {"name": "start"})
        env["MLAUNCH_HOME"] = os.path.join(tmp, "home")
        cases = {"python -c pass": [sys.executable, "-c", "pass"],
                 "import pydantic, jinja2, yaml, click": [sys.executable, "-c", "import pydantic, jinja2, yaml, click"],
                 "import launcher.spec.models": [sys.executable, "-c", "import launcher.spec.models"],
                 "submit --dry-run (8 hosts)": [sys.executable, "-m", "launcher.cli", "submit", "--dry-run", spec]}
        for argv in cases.values():   # caches warm (page cache, __pycache__) before timing
            timed(argv, 1, env)
        print(f"{sys.version.split()[0]} on {os.cpu_count()} cores; {args.runs} runs each, medians (range)")
        for name, argv in cases.items():
            xs = timed(argv, args.runs, env)
            print(f"  {name:38s} {statistics.median(xs):.3f} s ({min(xs):.3f}-{max(xs):.3f})")
        groups = import_groups(cases["submit --dry-run (8 hosts)"], env)
        print(f"the dry run's imports, self time by package: {sum(groups.values()):.3f} s in all")
        for name, s in sorted(groups.items(), key=lambda kv: -kv[1])[:12]:
            print(f"  {name:24s} {s:.3f} s")


if __name__ == "__main__":
    main()

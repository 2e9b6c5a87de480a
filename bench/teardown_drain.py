"""The node-side teardown's drain on a node with many processes: how long the script ends a
torchrun-like agent (ignores SIGTERM) after its rank is gone, asked for a 1 s drain, with N
idle processes on the machine (each wait of the script scans /proc twice). The script as it
is (time from /proc/uptime) against the one before c3c6c7f (passes of its loop counted), the
two rendered from the same template engine in the same run.

  python3 bench/teardown_drain.py [EXTRA_PROCESSES] [RUNS]      # default 2000, 3
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from launcher import render  # noqa: E402
from tests.procs import own_name  # noqa: E402
from tests.test_teardown_script import MEEK, STUBBORN, _start  # noqa: E402

BEFORE = "c3c6c7f^"   # the template with counted passes


def old_script(**kw) -> str:
    """render.teardown_script's text from the template as it was before c3c6c7f."""
    text = subprocess.run(["git", "-C", ROOT, "show", f"{BEFORE}:templates/teardown.sh.j2"],
                          capture_output=True, text=True, check=True).stdout
    return render.environment().from_string(text).render(**kw)


def once(tmp: str, script_of) -> float:
    """Seconds from the script's start to its end: the rank dies on TERM, the agent is KILLed
    after the drain."""
    run_id = own_name("tdd-")
    agent = _start(run_id, STUBBORN, os.path.join(tmp, run_id + "a"))
    _start(run_id, MEEK, os.path.join(tmp, run_id + "r"))
    pidfile = os.path.join(tmp, run_id + ".pid")
    with open(pidfile, "w") as fh:
        fh.write(str(agent.pid))
    kw = dict(match=f"MLAUNCH_RUN_ID={run_id}", pidfiles=[pidfile], grace=30.0, first_signal="TERM",
              agents=[pidfile], drain=1.0)
    t0 = time.perf_counter()
    out = subprocess.run(["/bin/sh", "-c", script_of(**kw)], capture_output=True, text=True, timeout=120).stdout
    elapsed = time.perf_counter() - t0
    assert out.strip() == "mlaunch-teardown: 0 left", out
    return elapsed


def main() -> None:
    extra = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    now = lambda **kw: render.render("teardown.sh.j2", **kw)  # noqa: E731
    idle = [subprocess.Popen(["sleep", "600"]) for _ in range(extra)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows = {"now": [], "before": []}
            for _ in range(runs):
                rows["now"].append(once(tmp, now))
                rows["before"].append(once(tmp, old_script))
    finally:
        for p in idle:
            p.kill()
        for p in idle:
            p.wait()
    procs = len([d for d in os.listdir("/proc") if d.isdigit()])
    print(f"drain asked 1.0 s, grace 30 s, {extra} idle processes added (~{procs} after they went)")
    for name, xs in rows.items():
        print(f"  {name:7s} median {statistics.median(xs):.2f} s  ({', '.join(f'{x:.2f}' for x in xs)})")
    print(f"  before / now: {statistics.median(rows['before']) / statistics.median(rows['now']):.2f}")


if __name__ == "__main__":
    main()

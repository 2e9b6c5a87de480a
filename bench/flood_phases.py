"""Where a log flood's wall time goes, end to end: raw parallel `ssh host cmd > file` against
mlaunch (bench/logflood.py's two paths), interleaved, with mlaunch's phases timed from the
start of run_job: every host logged in (await_ready), every host staged (stage), every node
sent its script (start), the first and last node's end (OpenSSHRunning.wait), run_job's
return. The ratio is raw ssh's wall over mlaunch's, per run and as the median of the runs.

  python3 bench/flood_phases.py --hosts 64 --mb 20 --runs 5     # (as root: namespace hosts)
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

from bench.logflood import flood_args, via_mlaunch, via_ssh
from bench.phases import timed
from launcher.transport.openssh import OpenSSHStreams
from launcher.transport.openssh_running import OpenSSHRunning
from tests.hosts import make_hosts

SPANS: dict[str, list[tuple[float, float]]] = {}


def span(name: str, start: float, end: float) -> None:
    SPANS.setdefault(name, []).append((start, end))


def phases(t0: float, total: float) -> dict[str, float]:
    """Seconds from t0 at which each phase ended."""
    def last(name):
        return max(e for _, e in SPANS[name]) - t0
    return {"logged in": last("await_ready"), "staged": last("stage"), "started": last("start"),
            "first end": min(e for _, e in SPANS["wait"]) - t0, "last end": last("wait"), "returned": total}


def main() -> None:
    a, lines = flood_args(runs=5)
    n = a.hosts
    for cls, name in ((OpenSSHStreams, "await_ready"), (OpenSSHStreams, "stage"),
                      (OpenSSHStreams, "start"), (OpenSSHRunning, "wait")):
        timed(cls, name, span)
    rows = []
    with make_hosts(n, isolated_home=True) as hs:
        for _ in range(a.runs):
            with tempfile.TemporaryDirectory() as tmp:
                raw, bad, _ = via_ssh(hs, n, lines, tmp)
            assert bad == (0, 0, 0), bad
            SPANS.clear()
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                wall, bad, share, _ = via_mlaunch(hs, n, lines, tmp)
            assert bad == (0, 0, 0), bad
            p = phases(t0, wall)
            rows.append((raw, wall, share, p))
            print(f"ssh {raw:.2f}s  mlaunch {wall:.2f}s  ratio {raw / wall:.2f}  launcher {share:.2f} core  "
                  + "  ".join(f"{k} {v:.2f}" for k, v in p.items()) + f"  load {os.getloadavg()[0]:.1f}",
                  file=sys.stderr)
    med = statistics.median
    print(f"{n} hosts x {a.mb:g} MB, {a.runs} runs interleaved; ratio = raw parallel ssh s / mlaunch s")
    print(f"  ssh {med(r[0] for r in rows):.2f}s  mlaunch {med(r[1] for r in rows):.2f}s  "
          f"ratio median {med(r[0] / r[1] for r in rows):.2f} (per run: {', '.join(f'{r[0] / r[1]:.2f}' for r in rows)})"
          f"  launcher CPU share median {med(r[2] for r in rows):.2f} (max {max(r[2] for r in rows):.2f})")
    print("  mlaunch phases, median s from run_job's start: " +
          "  ".join(f"{k} {med(r[3][k] for r in rows):.2f}" for k in rows[0][3]))


if __name__ == "__main__":
    main()

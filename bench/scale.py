"""The launcher's cost as the cluster grows, on the namespace test hosts (root, sshd; see
tests/hosts.py): `mlaunch submit --no-preflight` of a script job whose torchrun is a stub (a
shell script that prints one step and exits), so that only the launcher's side is measured:
its wall time from start to every node started (events.jsonl's phases: connect to the
rendezvous mark), its own CPU seconds, its children's (the ssh clients), and its peak RSS.
Host counts alternate within each round; medians over --runs, then a least-squares line
per figure (fixed cost + per-host cost), with the residuals' largest share.

  python bench/scale.py --hosts 8,32,64,128,200 --runs 3
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from launcher.record import phases  # noqa: E402
from launcher.record.events import read_events  # noqa: E402
from tests.helpers import script_job, write_spec  # noqa: E402
from tests.hosts import make_hosts  # noqa: E402

# The launcher run under a wrapper that reports its own rusage and its children's at exit.
WRAP = ("import atexit, json, resource, runpy, sys\n"
        "def said():\n"
        "    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "    print('RUSAGE ' + json.dumps({'self': s.ru_utime + s.ru_stime, 'children': c.ru_utime + c.ru_stime,\n"
        "          'rss_mib': s.ru_maxrss / 1024}), file=sys.stderr, flush=True)\n"
        "atexit.register(said)\n"
        "sys.argv = ['mlaunch'] + sys.argv[1:]\n"
        "runpy.run_module('launcher.cli', run_name='__main__')\n")
STUB = "#!/bin/sh\necho '{\"step\": 1, \"loss\": 1.0}'\n"


def stub_bin(tmp: str) -> str:
    """A bin dir with this Python (the relay runs on it) and the stub torchrun beside it."""
    d = os.path.join(tmp, "bin")
    os.makedirs(d, exist_ok=True)
    if not os.path.exists(os.path.join(d, "python")):
        os.symlink(sys.executable, os.path.join(d, "python"))
        with open(os.path.join(d, "torchrun"), "w") as fh:
            fh.write(STUB)
        os.chmod(os.path.join(d, "torchrun"), 0o755)
    return os.path.join(d, "python")


def once(hs, n: int, tmp: str) -> dict:
    out = os.path.join(tmp, f"out-{n}-{time.time_ns()}")
    spec = script_job([h.ip for h in hs.hosts[:n]], 1, "steps.py", ["1", "0"], out, hs=hs,
                      python=stub_bin(tmp)) | {"name": f"scale{n}"}
    env = {**os.environ, "MLAUNCH_HOME": os.path.join(tmp, "home")}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", WRAP, "submit", write_spec(tmp, spec), "--no-preflight"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"exit {r.returncode}: {r.stdout[-1500:]} {r.stderr[-1500:]}")
    usage = json.loads(r.stderr.rsplit("RUSAGE ", 1)[1].splitlines()[0])
    (path,) = glob.glob(f"{out}/logs/*/events.jsonl")
    events = read_events(path)
    tl = phases.timeline(events)
    marks = [e for e in events if e["event"] == "phase"]   # every node started: the rendezvous mark
    started = (phases._t(next(e for e in marks if e["phase"] == "rendezvous")) - phases._t(marks[0])).total_seconds()
    return {"hosts": n, "started_s": started, "wall_s": wall, **usage,
            "phases": {p.name: round(p.seconds, 3) for p in tl if p.attempt == 0}}


def fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x: (a, b, the largest residual as a share of its y)."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    worst = max(abs(y - (a + b * x)) / y for x, y in zip(xs, ys) if y)
    return a, b, worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", default="8,32,64,128,200")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    counts = [int(x) for x in args.hosts.split(",")]
    rows: dict[int, list[dict]] = {n: [] for n in counts}
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, make_hosts(max(counts), isolated_home=True) as hs:
        print(f"{max(counts)} hosts up in {time.perf_counter() - t:.1f} s", flush=True)
        for i in range(args.runs):
            for n in (counts if i % 2 == 0 else counts[::-1]):
                row = once(hs, n, tmp)
                rows[n].append(row)
                print(f"run {i} {n:4d} hosts: started {row['started_s']:6.2f} s, launcher CPU "
                      f"{row['self']:6.2f} s, ssh clients {row['children']:6.2f} s, peak RSS "
                      f"{row['rss_mib']:6.1f} MiB, wall {row['wall_s']:6.2f} s  {row['phases']}", flush=True)
    print()
    print(f"{'hosts':>5} {'started s':>16} {'launcher CPU s':>18} {'ssh clients CPU s':>18} {'peak RSS MiB':>13}")
    med = {}
    for n in counts:
        rs = rows[n]
        med[n] = {k: statistics.median(r[k] for r in rs) for k in ("started_s", "self", "children", "rss_mib")}
        rng = {k: (min(r[k] for r in rs), max(r[k] for r in rs)) for k in med[n]}
        print(f"{n:5d} " + " ".join(f"{med[n][k]:7.2f} ({rng[k][0]:.2f}-{rng[k][1]:.2f})" for k in med[n]))
    print()
    xs = [float(n) for n in counts]
    for k, what in (("started_s", "wall s to every node started"), ("self", "launcher CPU s"),
                    ("children", "ssh clients CPU s"), ("rss_mib", "peak RSS MiB")):
        a, b, worst = fit(xs, [med[n][k] for n in counts])
        print(f"{what:30s} fixed {a:8.3f} + {b:.4f} per host   (largest residual {worst:.0%})")


if __name__ == "__main__":
    main()

"""Where the CPU of a first-step run goes, per program, on the namespace test hosts: the same
job as bench/first_step.py (pdsh, or mlaunch with or without preflight), run under
`perf sched record` (the kernel's sched_stat_runtime events: every task's CPU time, however
short it lived), while /proc is polled every 5 ms for each task's command line. The table
sums CPU ms per program (comm | command line with addresses, ports and temporary paths
written X) and says how many tasks it was, over all hosts and the launcher. Tasks that lived
under 5 ms keep their comm only. The poller itself shows up as `python X X`.

  python bench/node_cpu.py --hosts 8 --variant nopre [--tree /other/tree] [--top 40]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.first_step import by_hand, mlaunch  # noqa: E402
from tests.hosts import make_hosts  # noqa: E402

RUNTIME = re.compile(r"sched_stat_runtime: comm=(.*?) pid=(\d+) runtime=(\d+)")
VOLATILE = re.compile(r"/tmp/\S+|\d+\.\d+\.\d+\.\d+|\d{4,}")


def poll_tasks(path: str) -> None:
    """Until SIGINT: every task's (process, command line), written to path as JSON."""
    seen: dict[str, tuple[str, str]] = {}
    stop = []
    signal.signal(signal.SIGINT, lambda *a: stop.append(1))
    while not stop:
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                tids = os.listdir(f"/proc/{p}/task")
                with open(f"/proc/{p}/cmdline", "rb") as fh:
                    cmd = fh.read().replace(b"\0", b" ")[:200].decode("utf-8", "replace")
            except OSError:
                continue
            for t in tids:
                if t not in seen or (cmd and seen[t][1] != cmd):
                    seen[t] = (p, cmd)
        time.sleep(0.005)
    with open(path, "w") as fh:
        json.dump(seen, fh)


def recorded(run, tmp: str) -> tuple[float, dict, str, str]:
    """run() under perf and the poller: (its first step, its phases, perf's file, the tasks' file)."""
    data, tasks = os.path.join(tmp, "perf.data"), os.path.join(tmp, "tasks.json")
    perf = subprocess.Popen(["perf", "sched", "record", "-o", data], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    poller = subprocess.Popen([sys.executable, __file__, "--poll", tasks])
    time.sleep(1.0)
    try:
        step, phases = run()
    finally:
        time.sleep(1.5)   # the last sessions end and are reaped
        for p in (perf, poller):
            p.send_signal(signal.SIGINT)
            p.wait()
    return step, phases, data, tasks


def table(data: str, tasks: str) -> list[tuple[float, int, str]]:
    """(CPU ms, tasks, program) per program, the costliest first."""
    out = subprocess.run(["perf", "script", "-i", data, "-F", "event,trace"], capture_output=True,
                         text=True, check=True).stdout
    with open(tasks) as fh:
        known = json.load(fh)
    ms: collections.Counter = collections.Counter()
    procs: dict[str, set] = collections.defaultdict(set)
    for m in RUNTIME.finditer(out):
        comm, tid, ns = m.group(1), m.group(2), int(m.group(3))
        proc, cmd = known.get(tid, (tid, ""))
        key = f"{comm} | {VOLATILE.sub('X', cmd)[:90]}".replace("\n", " ")
        ms[key] += ns / 1e6
        procs[key].add(proc)
    return [(v, len(procs[k]), k) for k, v in ms.most_common()]


def main() -> None:
    if sys.argv[1:2] == ["--poll"]:
        return poll_tasks(sys.argv[2])
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--variant", choices=("pdsh", "mlaunch", "nopre"), default="nopre")
    ap.add_argument("--tree", default=ROOT)
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(args.tree, "launcher")],
                   check=True, stdout=subprocess.DEVNULL)
    n = args.hosts
    with tempfile.TemporaryDirectory() as tmp, make_hosts(n, isolated_home=True) as hs:
        run = (lambda: by_hand(hs, n, tmp)) if args.variant == "pdsh" else \
            (lambda: mlaunch(hs, n, tmp, args.tree, args.variant == "mlaunch"))
        step, phases, data, tasks = recorded(run, tmp)
        rows = table(data, tasks)
    print(f"{n} hosts, {args.variant}, tree {args.tree}: first step {step:.2f} s; phases "
          + json.dumps({k: round(v, 2) for k, v in phases.items()}))
    print(f"{'CPU ms':>9s} {'tasks':>5s}  program (comm | command line)")
    for v, k, name in rows[:args.top]:
        print(f"{v:9.1f} {k:5d}  {name}")


if __name__ == "__main__":
    main()

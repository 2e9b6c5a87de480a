"""Log throughput and integrity: N hosts each print MB of numbered lines.

Compared in one run: mlaunch's streaming path (SSH executor -> pty -> line splitter ->
prefixed printer + per-node log files) against plain parallel `ssh host cmd > file`.
Every line is checked: no loss, no duplicate, no tear (sequence numbers + exact payload).
"""
from __future__ import annotations

import dataclasses
import glob
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from launcher.execute.job import run_job
from launcher.execute.ssh import SSHExecutor
from launcher.execute.stream import Printer
from launcher.plan.launch_plan import build_plan
from launcher.spec import SSH, validate
from tests.helpers import script_job
from tests.hosts import make_hosts

LINE_BYTES = 100
PAYLOAD = "x" * (LINE_BYTES - 11)  # "%09d " + payload + "\n" == 100 bytes
GEN = ("import sys\nw = sys.stdout.write\np = '{p}'\n"
       "for i in range({n}):\n    w('%09d %s\\n' % (i, p))\n")


def generator(lines: int) -> str:
    code = GEN.format(p=PAYLOAD, n=lines)
    return f"exec python3 -c {quote(code)}"


def quote(s: str) -> str:
    import shlex
    return shlex.quote(s)


def check(lines_by_node: dict[int, list[str]], expected: int) -> tuple[int, int, int]:
    """(lost, duplicated, torn) over all nodes."""
    lost = dup = torn = 0
    for lines in lines_by_node.values():
        seen = set()
        for line in lines:
            m = re.fullmatch(r"(\d{9}) (x+)", line)
            if not m or m.group(2) != PAYLOAD:
                torn += 1
                continue
            seq = int(m.group(1))
            dup += seq in seen
            seen.add(seq)
        lost += expected - len(seen)
    return lost, dup, torn


def via_mlaunch(hs, n: int, lines: int, tmp: str) -> tuple[float, tuple[int, int, int]]:
    spec = script_job([h.ip for h in hs.hosts[:n]], 1, "allreduce.py", [], os.path.join(tmp, "out"), hs=hs)
    plan = build_plan(validate(spec))
    nodes = tuple(dataclasses.replace(nd, script=generator(lines)) for nd in plan.nodes)
    plan = dataclasses.replace(plan, nodes=nodes)
    out_path = os.path.join(tmp, "mlaunch.out")
    with open(out_path, "w") as out:
        t0 = time.perf_counter()
        result = run_job(plan, SSHExecutor([nd.login for nd in nodes], SSH(
            user="root", key_file=hs.key_file, known_hosts=hs.known_hosts)), Printer(plan.mask, out))
        elapsed = time.perf_counter() - t0
    assert result.code == 0, result
    by_node: dict[int, list[str]] = {k: [] for k in range(n)}
    with open(out_path) as fh:
        for line in fh:
            m = re.match(r"\[node(\d+) \S+\] (.*)$", line.rstrip("\n"))
            if m:
                by_node[int(m.group(1))].append(m.group(2))
    printed = check(by_node, lines)
    logged = check({k: open(p).read().splitlines() for k, p in
                    enumerate(sorted(glob.glob(f"{plan.log_dir}/node*.log")))}, lines)
    return elapsed, tuple(a + b for a, b in zip(printed, logged))


def via_ssh(hs, n: int, lines: int, tmp: str) -> tuple[float, tuple[int, int, int]]:
    files = [open(os.path.join(tmp, f"ssh{k}.out"), "w") for k in range(n)]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(hs.ssh_argv(h) + [generator(lines)], stdout=f)
             for h, f in zip(hs.hosts[:n], files)]
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - t0
    for f in files:
        f.close()
    assert codes == [0] * n
    by_node = {k: open(f.name).read().splitlines() for k, f in enumerate(files)}
    return elapsed, check(by_node, lines)


def bench_logs(runs: int, mb: int, n: int = 8) -> None:
    lines = mb * 1_000_000 // LINE_BYTES
    with make_hosts(n, isolated_home=True) as hs:
        ours, theirs = [], []
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as tmp:
                t, bad = via_mlaunch(hs, n, lines, tmp)
                ours.append(t)
                print(f"mlaunch: {t:.2f}s lost/dup/torn={bad}", file=sys.stderr)
                assert bad == (0, 0, 0), bad
            with tempfile.TemporaryDirectory() as tmp:
                t, bad = via_ssh(hs, n, lines, tmp)
                theirs.append(t)
                print(f"ssh:     {t:.2f}s lost/dup/torn={bad}", file=sys.stderr)
                assert bad == (0, 0, 0), bad
    total = n * mb
    m, s = statistics.median(ours), statistics.median(theirs)
    print(f"{n} hosts x {mb} MB: mlaunch {total / m:.1f} MB/s (median {m:.2f}s), "
          f"parallel ssh {total / s:.1f} MB/s (median {s:.2f}s); throughput ratio {s / m:.2f}; "
          "0 lost, duplicated or torn lines")

"""Where the CPU of a log flood goes, in one run: raw parallel `ssh host cmd > file` against
mlaunch end to end (bench/logflood.py's two paths), each run's CPU seconds on the launcher's
side (its own process, its `ssh` children) and on the nodes' side (every session each host's
sshd served in that run, with all it ran: sshd's reaped children, read from /proc after the
run). On one machine with namespace hosts both sides share the cores, so a path's wall time
follows its total CPU once the cores are saturated.

  python3 bench/flood_cpu.py --hosts 64 --mb 20 --runs 2     # (as root: namespace hosts)
"""
from __future__ import annotations

import os
import resource
import statistics
import sys
import tempfile
import time

from bench.logflood import cpu_s, flood_args, via_mlaunch, via_ssh
from tests.hosts import make_hosts

HZ = os.sysconf("SC_CLK_TCK")


def reaped_cpu(pids) -> float:
    """CPU seconds of the reaped children of pids (cutime + cstime: whole session trees)."""
    total = 0
    for pid in pids:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        total += int(fields[13]) + int(fields[14])
    return total / HZ


def once(hs, path: str, n: int, lines: int) -> dict:
    sshds = [h.sshd_pid for h in hs.hosts[:n]]
    with tempfile.TemporaryDirectory() as tmp:
        r0, s0, c0 = reaped_cpu(sshds), cpu_s(resource.RUSAGE_SELF), cpu_s(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        result = via_ssh(hs, n, lines, tmp) if path == "ssh" else via_mlaunch(hs, n, lines, tmp)
        wall = time.perf_counter() - t0
        self_cpu = cpu_s(resource.RUSAGE_SELF) - s0   # holds the check of every line: see below
        clients = cpu_s(resource.RUSAGE_CHILDREN) - c0
        deadline = time.monotonic() + 30
        # The sessions end after the clients: every host's sshd reaps its session first.
        while time.monotonic() < deadline and any(len(h.pids()) > 1 for h in hs.hosts[:n]):
            time.sleep(0.05)
        nodes = reaped_cpu(sshds) - r0
    elapsed = result[0]
    assert result[1] == (0, 0, 0), result
    launcher = result[2] * elapsed if path == "mlaunch" else 0.0
    return {"path": path, "wall": elapsed, "launcher": launcher, "clients": clients, "nodes": nodes,
            "total": launcher + clients + nodes, "checked_wall": wall, "self_incl_check": self_cpu}


def main() -> None:
    a, lines = flood_args(runs=2)
    rows: dict[str, list[dict]] = {"ssh": [], "mlaunch": []}
    with make_hosts(a.hosts, isolated_home=True) as hs:
        for _ in range(a.runs):
            for path in rows:
                r = once(hs, path, a.hosts, lines)
                rows[path].append(r)
                print(f"{path:8s} wall {r['wall']:.2f}s  CPU s: launcher {r['launcher']:.2f}  ssh clients "
                      f"{r['clients']:.2f}  nodes {r['nodes']:.2f}  total {r['total']:.2f}", file=sys.stderr)
    print(f"{a.hosts} hosts x {a.mb:g} MB, {a.runs} runs, medians (CPU seconds; 'nodes' is every "
          f"session's whole tree on the hosts: sshd, the shell, relay, writer)")
    med = {p: {k: statistics.median(r[k] for r in rs) for k in ("wall", "launcher", "clients", "nodes", "total")}
           for p, rs in rows.items()}
    for p, m in med.items():
        print(f"  {p:8s} wall {m['wall']:.2f}s  launcher {m['launcher']:.2f}  ssh clients {m['clients']:.2f}  "
              f"nodes {m['nodes']:.2f}  total {m['total']:.2f}  ({m['total'] / med['ssh']['total']:.2f}x ssh's)")


if __name__ == "__main__":
    main()

"""Where a command's CPU goes, by kind of process: runs COMMAND with the kernel's BSD process
accounting on (acct(2): one record per process that exits, its user and system CPU), labels
every process by its command line (read from /proc while the command runs), keeps the
processes that descend from COMMAND (namespace hosts' sshd sessions, torchrun, trainer ranks,
Ray's and Slurm's daemons the command started), and sums their CPU by kind.

tests/cpuacct.py says what each test costs the suite; this says what inside a test costs it
(issue 57: the suite is CPU-bound, both cores busy). Root only; the records are written by the
kernel, so a process that never exits while COMMAND runs is not counted (a daemon left behind).

  python tools/cpu_by_process.py [--top 25] -- python -m pytest -q tests/test_x.py
"""
from __future__ import annotations

import argparse
import ctypes
import os
import struct
import subprocess
import sys
import tempfile
import threading
from collections import defaultdict

HZ = 100            # acct(2) v3 counts comp_t in AHZ ticks (100 a second)
RECORD = struct.Struct("<BBHIIIIIIfHHHHHHHH16s")   # struct acct_v3, 64 bytes


def comp_t(v: int) -> int:
    """A comp_t (13-bit mantissa, 3-bit base-8 exponent) as an integer."""
    return (v & 0x1FFF) << (3 * ((v >> 13) & 7))


def records(path: str):
    """(pid, ppid, comm, cpu seconds) of each exited process in an acct v3 file."""
    data = open(path, "rb").read()
    for off in range(0, len(data) - RECORD.size + 1, RECORD.size):
        f = RECORD.unpack_from(data, off)
        if f[1] != 3:        # ac_version 3 only
            continue
        comm = f[18].split(b"\0", 1)[0].decode(errors="replace")
        yield f[6], f[7], comm, (comp_t(f[10]) + comp_t(f[11])) / HZ


class Watcher(threading.Thread):
    """Reads every process's command line and parent from /proc, 10 times a second."""

    def __init__(self):
        super().__init__(daemon=True)
        self.cmd: dict[int, str] = {}
        self.parent: dict[int, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.scan()
            self.stop.wait(0.1)

    def scan(self) -> None:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            try:
                raw = open(f"/proc/{pid}/cmdline", "rb").read()     # the latest: after an exec
                if raw:
                    self.cmd[pid] = raw.replace(b"\0", b" ").decode(errors="replace").strip()
                if pid not in self.parent:
                    stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                    self.parent[pid] = int(stat[1])
            except OSError:
                continue


KINDS = [   # (kind, what the start of the command line holds); the first that matches names it
    ("mlaunch node program (python - ARGS)", (" - ",)),
    ("trainer rank: LLaMA-Factory", ("llamafactory_entry", "llamafactory.launcher", "llamafactory-cli")),
    ("trainer rank: ms-swift", ("swift_entry", "swift.cli", "swift/cli")),
    ("torchrun agent", ("torchrun", "torch.distributed.run")),
    ("mlaunch launcher (CLI)", ("launcher.cli", "bin/mlaunch")),
    ("mlaunch supervisor", ("launcher.backends.supervisor",)),
    ("pytest", ("pytest",)),
    ("Ray", ("ray::", "raylet", "gcs_server", "/ray/", "ray start")),
    ("Slurm", ("slurm", "munge")),
    ("podman", ("podman", "conmon", "crun", "catatonit")),
    ("sshd", ("sshd",)),
]


def kind(cmd: str, comm: str) -> str:
    """A process's kind from the first words of its command line (a node program's JSON
    argument holds any word), else its program's name."""
    head = " ".join(cmd.split(" ")[:4])[:300]
    for name, marks in KINDS:
        if any(m in head for m in marks):
            return name
    base = os.path.basename(cmd.split(" ", 1)[0]) if cmd else comm
    return f"other: {base or comm}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    argv = a.command[1:] if a.command[:1] == ["--"] else a.command
    libc = ctypes.CDLL(None, use_errno=True)
    fd, path = tempfile.mkstemp(prefix="mlaunch-acct-")
    os.close(fd)
    if libc.acct(path.encode()) != 0:
        sys.exit(f"acct({path}): {os.strerror(ctypes.get_errno())} (root and CONFIG_BSD_PROCESS_ACCT needed)")
    watch = Watcher()
    watch.start()
    try:
        child = subprocess.Popen(argv)
        rc = child.wait()
    finally:
        libc.acct(None)
        watch.stop.set()
        watch.join()
    report(list(records(path)), watch, child.pid, a.top)
    os.unlink(path)
    sys.exit(rc)


def report(recs, watch: Watcher, root: int, top: int) -> None:
    parent = dict(watch.parent)
    for pid, ppid, _, _ in recs:
        parent.setdefault(pid, ppid)

    def descends(pid: int) -> bool:
        seen = set()
        while pid and pid not in seen:
            if pid == root:
                return True
            seen.add(pid)
            pid = parent.get(pid, 0)
        return False

    by_kind, count = defaultdict(float), defaultdict(int)
    for pid, _, comm, cpu in recs:
        if descends(pid):
            k = kind(watch.cmd.get(pid, ""), comm)
            by_kind[k] += cpu
            count[k] += 1
    total = sum(by_kind.values())
    print(f"\nCPU by kind of process: {total:.1f} s in {sum(count.values())} exited processes under pid {root}")
    for k, cpu in sorted(by_kind.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {cpu:8.1f} s {cpu / max(total, 1e-9):6.1%} {count[k]:6d} procs  {k}")


if __name__ == "__main__":
    main()

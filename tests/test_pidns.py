"""Each test host is a separate machine as far as processes go (tests/hostkit/sshd.py, PID
namespaces): a host's ps, /proc and pkill see only its own processes, while the fixture
(Host.pids(), freeze()) still sees every process of a host by its PID in the root namespace."""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time

import pytest

try:
    from . import hosts as H
    from .loadfactor import limit
except ImportError:
    if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # importlib mode
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hosts as H
    from loadfactor import limit

pytestmark = pytest.mark.multihost

PY = sys.executable
# A marked process that never forks (a forked child carries its parent's command line until
# it execs), so a marker names exactly one process.
SLEEPER = "import time; time.sleep(600)"


def ssh(hs, host, cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(hs.ssh_argv(host) + [cmd], capture_output=True, text=True,
                          timeout=limit(timeout))


def state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:   # gone since the scan
        return b""


def marked(host, marker: str) -> set[int]:
    """host's sleepers carrying marker (python only: a shell's forks carry its command line,
    e.g. the $(...) of root's ~/.bashrc in an ssh session, until they exec or exit)."""
    return {p for p in host.pids()
            if cmdline(p).startswith(PY.encode() + b"\0") and marker.encode() in cmdline(p)}


def wait_for(cond, what: str, timeout: float = 5):
    deadline = time.monotonic() + limit(timeout)
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


# What a host sees of a marker: PIDs from its ps and from its /proc. The marker reaches the
# host reversed and is read from a file, so no process of this probe carries it.
SEE = ("f=$(mktemp); echo {rev} | rev > $f; "
       "echo ps: $(ps -eo pid=,args= | grep -Ff $f | awk '{{print $1}}'); "
       "echo proc: $(grep -lFf $f /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3); rm -f $f")


def seen(hs, host, marker: str) -> dict[str, set[int]]:
    r = ssh(hs, host, SEE.format(rev=marker[::-1]))
    assert r.returncode == 0, r
    out = {}
    for line in r.stdout.splitlines():
        k, _, v = line.partition(":")
        out[k] = {int(x) for x in v.split()}
    return out


def test_a_host_sees_and_kills_only_its_own_processes(hosts2):
    a, b = hosts2.hosts
    marker = f"mlhmark{secrets.token_hex(4)}"
    # One process started by the fixture (Host.popen), one by an ssh session that left it
    # behind (a stale rank of a run whose launcher went away).
    direct = a.popen([PY, "-c", SLEEPER, marker])
    r = ssh(hosts2, a, f"setsid {PY} -c '{SLEEPER}' {marker} </dev/null >/dev/null 2>&1 & "
                       "echo $!")
    assert r.returncode == 0, r
    left_inner = int(r.stdout.split()[-1])
    try:
        # Host.pids() lists both, by their PIDs here; the host shows them by its own PIDs.
        def marked_root() -> set[int]:
            return marked(a, marker)
        mine = wait_for(lambda: len(marked_root()) == 2 and marked_root(), "both in a.pids()")
        assert direct.pid in mine
        left = (mine - {direct.pid}).pop()
        assert a.inner_pid(left) == left_inner
        assert a.inner_pid(direct.pid) not in (None, direct.pid)
        assert not mine & b.pids()
        assert b.inner_pid(direct.pid) is None
        inner = {a.inner_pid(p) for p in mine}

        # Host a's ps and /proc show them (by a's PIDs); host b's show nothing of them.
        assert seen(hosts2, a, marker) == {"ps": inner, "proc": inner}
        assert seen(hosts2, b, marker) == {"ps": set(), "proc": set()}

        # pkill -f in host b finds nothing (exit 1) and leaves a's processes alive (the
        # session's shell gets the marker reversed: pkill would match that shell too).
        pkill = f'pkill -f "$(echo {marker[::-1]} | rev)"; echo rc=$?'
        r = ssh(hosts2, b, pkill)
        assert r.stdout.strip().endswith("rc=1"), r
        time.sleep(0.2)
        assert all(H._pid_alive(p) for p in mine), {p: state(p) for p in mine}
        assert direct.poll() is None
        # pkill -f in host a kills both, and they disappear from a.pids().
        r = ssh(hosts2, a, pkill)
        assert r.stdout.strip().endswith("rc=0"), r
        assert direct.wait(limit(5)) == -signal.SIGTERM   # pkill's signal, the command itself
        wait_for(lambda: not marked_root(), "a's marked processes gone")
    finally:
        direct.kill()
        direct.wait()


def test_pid1_is_the_hosts_own_and_stop_sshd_leaves_sessions_running(hosts2):
    a, b = hosts2.hosts
    r = ssh(hosts2, a, "cat /proc/1/comm; ps -eo pid=,comm= | grep -c sshd")
    assert r.returncode == 0 and r.stdout.split()[0] == "mlh-init", r
    marker = f"mlhmark{secrets.token_hex(4)}"
    client = subprocess.Popen(hosts2.ssh_argv(a) + [f"exec {PY} -c '{SLEEPER}' {marker}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        session = wait_for(lambda: marked(a, marker), "the session's command in a.pids()")
        a.stop_sshd()   # the listener only: a real sshd's death leaves its sessions
        time.sleep(0.2)
        assert all(H._pid_alive(p) for p in session) and client.poll() is None
        assert marked(a, marker) == session
        # and b is untouched by a's sshd going
        r = ssh(hosts2, b, "hostname")
        assert r.returncode == 0 and r.stdout.strip() == b.name, r
    finally:
        client.kill()
        client.wait()


def test_freeze_stops_every_process_of_one_host_only(hosts2):
    a, b = hosts2.hosts
    sleeper = a.popen(["sleep", "600"])
    try:
        stopped = a.freeze()
        try:
            assert sleeper.pid in stopped and a.sshd_pid in stopped and a.init_pid in stopped
            wait_for(lambda: {state(p) for p in stopped} <= {None, "Z", "T"},
                     "every process of a stopped")
            assert "T" not in {state(p) for p in b.pids() | {b.init_pid}}
            r = ssh(hosts2, b, "hostname")
            assert r.returncode == 0 and r.stdout.strip() == b.name, r
        finally:
            a.thaw()
        assert "T" not in {state(p) for p in a.pids() | {a.init_pid}}
        r = ssh(hosts2, a, "hostname")
        assert r.returncode == 0 and r.stdout.strip() == a.name, r
    finally:
        sleeper.kill()
        sleeper.wait()


def test_slurm_nodes_see_only_their_own_processes(slurm2):
    """slurmd runs in its host's PID namespace: a job step on a node sees that node's
    mlh-init as PID 1, one slurmd, and none of the other node's processes."""
    r = slurm2.run(["srun", "-N2", "-l", "sh", "-c",
                    "echo pid1 $(cat /proc/1/comm); echo slurmd $(pgrep -cx slurmd); hostname"],
                   timeout=limit(60))
    by_task: dict[str, list[str]] = {}
    for line in r.stdout.splitlines():
        task, _, rest = line.partition(": ")
        by_task.setdefault(task.strip(), []).append(rest.strip())
    names = [h.name for h in slurm2.hs.hosts]
    assert sorted(v[2] for v in by_task.values()) == sorted(names), r.stdout
    for v in by_task.values():
        assert v[:2] == ["pid1 mlh-init", "slurmd 1"], r.stdout

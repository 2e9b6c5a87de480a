"""cluster.warm_start on namespace hosts with the real torchrun: taken on every node, the
job's sums and exit as without it, and a refused preflight leaves no warm process on any host."""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from .helpers import limit, script_job
from .test_fanout import check_allreduce, job_pids, node_logs, start, submit

WARM = "mlaunch: torchrun started warm"


@pytest.mark.multihost
@pytest.mark.parametrize("warm", [True, False])
def test_every_node_runs_torchrun_warm_and_the_job_is_the_same(make_hostset, tmp_path, warm):
    with make_hostset(2) as hs:
        out = str(tmp_path / "out")
        r = submit(tmp_path, script_job([h.ip for h in hs.hosts], 2, "allreduce.py", [], out, hs=hs,
                                        warm_start=warm))
        check_allreduce(r, 4, 2, out)
        logs = node_logs(out)
        assert len(logs) == 2 and all((WARM in text) == warm for text in logs.values()), logs
        for h in hs.hosts:
            assert job_pids(h, set()) == set(), f"left on {h.name}"


@pytest.mark.multihost
def test_a_refused_preflight_ends_every_warm_process_and_starts_nothing(make_hostset, tmp_path):
    """The warm processes start at login, before the checks; the port check on node 0 fails:
    exit 2, and no host keeps a process of the job (each namespace's own, by pid)."""
    with make_hostset(2) as hs:
        out = str(tmp_path / "out")
        spec = script_job([h.ip for h in hs.hosts], 1, "allreduce.py", [], out, hs=hs)
        port = spec["cluster"]["master_port"]
        code = (f"import socket,time; s=socket.socket(); s.bind(('0.0.0.0', {port})); s.listen(); "
                "print('up', flush=True); time.sleep(300)")
        squatter = hs.hosts[0].popen([sys.executable, "-c", code], stdout=-1)
        try:
            assert squatter.stdout.readline().strip() == "up"
            r = submit(tmp_path, spec)
            assert r.returncode == 2, r.stdout[-3000:] + r.stderr
            assert f"TCP {port} is in use" in r.stdout + r.stderr
            for h in hs.hosts:
                keep = {squatter.pid} if h is hs.hosts[0] else set()
                assert job_pids(h, keep) == set(), f"left on {h.name}"
        finally:
            squatter.kill()
            squatter.wait()


def _warm_pid(host) -> int | None:
    """A warm process in host's namespace (its hold directory on the command line), by pid."""
    for pid in host.pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"mlaunch-warm." in fh.read():
                    return pid
        except OSError:
            pass
    return None


@pytest.mark.multihost
def test_a_node_starts_warm_while_another_host_is_still_logging_in(make_hostset, tmp_path):
    """Host 1's sshd is stopped (SIGSTOP: its logins wait in the listen queue): host 0's warm
    process starts all the same, since each node's warm frame goes as soon as its own host is
    logged in, not once the slowest one is (at 64 hosts the logins span a second). Host 1
    resumed, the job runs warm on both and sums right. Before, host 0 waited for host 1."""
    with make_hostset(2) as hs:
        out = str(tmp_path / "out")
        spec = script_job([h.ip for h in hs.hosts], 2, "allreduce.py", [], out, hs=hs)
        spec["cluster"]["ssh"]["connect_timeout"] = min(300, limit(120))   # host 1 waits, it is no dead host
        frozen = hs.hosts[1].sshd_pid
        os.kill(frozen, signal.SIGSTOP)
        proc = None
        try:
            proc = start(tmp_path, spec)
            deadline = time.monotonic() + limit(60)
            while (warm := _warm_pid(hs.hosts[0])) is None and proc.poll() is None:
                assert time.monotonic() < deadline, "host 0 started no warm process while host 1 logged in"
                time.sleep(0.05)
            assert warm is not None, proc.communicate()[0][-3000:]
            assert _warm_pid(hs.hosts[1]) is None   # its login has not even begun
        finally:
            os.kill(frozen, signal.SIGCONT)
        out_text, _ = proc.communicate(timeout=limit(180))
        r = type("R", (), {"returncode": proc.returncode, "stdout": out_text, "stderr": ""})()
        check_allreduce(r, 4, 2, out)
        assert all(WARM in text for text in node_logs(out).values())
        for h in hs.hosts:
            assert job_pids(h, set()) == set(), f"left on {h.name}"

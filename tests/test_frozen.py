"""A frozen node, a dead one and an unreachable one told apart (issue 50) whatever LogLevel the
user's ssh config sets (the namespace hosts' says ERROR, which hid ssh's "Timeout, server not
responding" and made a freeze a plain "exit 255"): ssh's own words decide, never paramiko's.
The freeze and the hard kill each print how long after the break the next attempt was decided
(the restart line): a comparison for the report, not a limit the tests hold."""
from __future__ import annotations

import errno
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

import paramiko
import pytest

from launcher.transport.base import LOST, Exit
from launcher.transport.openssh import READY, SILENT, OpenSSHStreams, unreached_line
from launcher.transport.ssh_paramiko import explain_connect_error
from launcher.spec import SSH

from .helpers import ROOT, SSH_CONNECT_S, limit, script_job

FROZEN = ("connection lost: not responding (no answer to ssh keepalives in 6 s: the machine is "
          "frozen, or its link is down)")


class Console:
    """mlaunch's console (stdout and stderr together), each line with the time it came."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines = proc, []
        self._new = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._new:
                self.lines.append((time.monotonic(), line))
                self._new.notify_all()
        with self._new:
            self.lines.append((time.monotonic(), ""))   # the end: every waiter wakes
            self._new.notify_all()

    def when(self, text: str, timeout: float) -> float | None:
        """When the first line holding text came, waiting up to timeout s; None if it never did."""
        deadline = time.monotonic() + timeout
        with self._new:
            while not (hit := next((t for t, ln in self.lines if text in ln), None)):
                if time.monotonic() > deadline or not self._reader.is_alive() and self.lines[-1][1] == "":
                    return None
                self._new.wait(0.5)
            return hit

    def finish(self) -> None:
        """Wait until the reader has every line (mlaunch has ended)."""
        self._reader.join(limit(10))

    @property
    def text(self) -> str:
        return "".join(ln for _, ln in self.lines)


def kill_all(host) -> None:
    """A hard death: SIGKILL every process of the host (sshd, its sessions, the ranks)."""
    for pid in host.pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def lose_node1(make_hostset, tmp_path, how: str) -> dict:
    """2 nodes + 1 spare, max_restarts 1, the HostSet's ssh config (LogLevel ERROR) read by
    mlaunch; node 1 frozen or killed once it has printed its first ticks. What came of it:
    console, events, exit code, the seconds from the break to the restart line, the hosts."""
    from .test_fanout import start
    with make_hostset(3) as hs:
        a, b, spare = hs.hosts
        out = str(tmp_path / "out")
        os.makedirs(out)
        job = script_job([a.ip, b.ip], 1, "tick_job.py", [out], out, hs=hs, hangup_after_s=6,
                         spare_hosts=[spare.ip]) | {"max_restarts": 1, "restart_backoff_s": 0}
        job["cluster"]["ssh"]["config_file"] = hs.ssh_config
        assert "LogLevel ERROR" in open(hs.ssh_config).read()
        proc = start(tmp_path, job)
        console = Console(proc)
        try:
            assert console.when("tick rank 1 i 1", limit(240)), console.text[-4000:]
            broken = time.monotonic()
            b.freeze() if how == "freeze" else kill_all(b)
            restart = console.when("restart 1/1:", limit(240))
            proc.wait(timeout=limit(240))
        finally:
            b.thaw()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        console.finish()
        (path,) = glob.glob(f"{out}/logs/*/events.jsonl")
        delay = None if restart is None else round(restart - broken, 1)
        print(f"\n{how} of node 1: the next attempt was decided {delay} s after it")
        return {"text": console.text, "events": [json.loads(ln) for ln in open(path)], "code": proc.returncode,
                "delay": delay, "b": b.ip, "spare": spare, "out": out}


def assert_restarted_on_the_spare(r: dict) -> None:
    """Exit 0 after the restart, whose node 1 ran on the spare; no traceback, no paramiko."""
    text = r["text"]
    assert r["code"] == 0, text[-4000:]
    assert "Traceback" not in text and "paramiko" not in text.lower(), text[-4000:]
    assert sorted(os.listdir(r["out"])) == ["done-rank0-attempt1", "done-rank1-attempt1", "logs"]
    assert open(os.path.join(r["out"], "done-rank1-attempt1")).read() == r["spare"].name


def test_a_frozen_node_is_lost_not_responding_whatever_the_ssh_configs_loglevel(make_hostset, tmp_path):
    """SIGSTOP of every process of node 1 (sshd, its session, the rank): the console and
    events.jsonl say the node was lost, not responding; it is among the lost ranks, so the
    spare takes it without a login to the frozen host (whose sshd would never answer)."""
    r = lose_node1(make_hostset, tmp_path, "freeze")
    text, b = r["text"], r["b"]
    assert_restarted_on_the_spare(r)
    assert f"[mlaunch] node1 {b}: {FROZEN}; tearing down the job on every host" in text, text[-4000:]
    assert (f"[mlaunch] host replaced: node1 {b} -> spare {r['spare'].ip} ({FROZEN}); the world stays "
            "2 processes") in text, text[-4000:]
    # the teardown did not wait out a login on the frozen host
    assert f"[mlaunch] teardown on {b}: not tried: the host stopped answering ssh keepalives" in text
    exits = [e for e in r["events"] if e["event"] == "node_exit" and e["attempt"] == 0 and e["node"] == 1]
    assert [(e["code"], e.get("lost")) for e in exits] == [(255, True)]
    (replaced,) = [e for e in r["events"] if e["event"] == "host_replaced"]
    assert (replaced["rank"], replaced["old_host"], replaced["reason"]) == (1, b, FROZEN)
    assert r["delay"] is not None


def test_a_killed_node_is_dead_not_frozen(make_hostset, tmp_path):
    """SIGKILL of every process of node 1: the host closed the connection (or, where node 0's
    end came first, refuses the next one): a dead node, never "not responding"; the spare
    takes its place. The delay printed is the freeze's yardstick."""
    r = lose_node1(make_hostset, tmp_path, "kill")
    text, b = r["text"], r["b"]
    assert_restarted_on_the_spare(r)
    assert "not responding" not in text, text[-4000:]
    (replaced,) = [e for e in r["events"] if e["event"] == "host_replaced"]
    assert (replaced["rank"], replaced["old_host"]) == (1, b)
    assert replaced["reason"] in (
        f"connection lost: closed by the host (ssh: Connection to {b} closed by remote host.)",
        "unreachable: connection refused on port 22: is sshd running there and the port open?"), replaced


def test_connecting_to_a_host_whose_link_is_down_or_sshd_stopped_gives_ssh_own_cause(make_hostset, tmp_path):
    """submit where node 1 cannot be reached: with its link down, ssh's own cause (no route,
    or the connect that timed out, as ssh says it); with its sshd stopped, the refusal. One
    line each, exit 2, nothing started, no paramiko traceback."""
    from .test_fanout import submit
    with make_hostset(2) as hs:
        a, b = hs.hosts
        job = script_job([a.ip, b.ip], 1, "tick_job.py", [str(tmp_path)], str(tmp_path / "out"), hs=hs)
        job["cluster"]["ssh"]["config_file"] = hs.ssh_config
        b.link_down()
        try:
            down = submit(tmp_path, job)
        finally:
            b.link_up()
        b.stop_sshd()
        refused = submit(tmp_path, job)
    for r in (down, refused):
        assert r.returncode == 2, r.stdout[-2000:] + r.stderr
        assert "Traceback" not in r.stdout + r.stderr and "paramiko" not in (r.stdout + r.stderr).lower()
        assert "nothing was started anywhere" in r.stderr, r.stderr
    (line,) = [ln for ln in down.stderr.splitlines() if f"host {b.ip}:" in ln]
    print(f"\nlink down: {line}\nsshd stopped: {refused.stderr.strip().splitlines()[-1]}")
    assert line in (
        f"mlaunch: host {b.ip}: ssh: connect to host {b.ip} port 22: No route to host; the machine "
        "is down or not on this network: check that it is up and reachable from here",
        f"mlaunch: host {b.ip}: ssh: connect to host {b.ip} port 22: Connection timed out; no answer "
        f"in {SSH_CONNECT_S}s: the machine is down or port 22 is firewalled: check it, or raise cluster.ssh.connect_timeout"), line
    (line,) = [ln for ln in refused.stderr.splitlines() if f"host {b.ip}:" in ln]
    assert line == (f"mlaunch: host {b.ip}: connection refused on port 22: is sshd running there and "
                    "the port open?"), line


# -- the same decisions without hosts --------------------------------------------------------


@pytest.mark.parametrize("said, line", [
    (["ssh: connect to host 10.0.0.5 port 22: No route to host"],
     "ssh: connect to host 10.0.0.5 port 22: No route to host; the machine is down or not on this "
     "network: check that it is up and reachable from here"),
    (["ssh: connect to host n1 port 2222: Connection refused"],
     "connection refused on port 2222: is sshd running there and the port open?"),
    (["ssh: connect to host n1 port 22: Connection timed out"],
     "ssh: connect to host n1 port 22: Connection timed out; no answer in 7s: the machine is down "
     "or port 22 is firewalled: check it, or raise cluster.ssh.connect_timeout"),
    # at LogLevel INFO ssh says the banner wait first, then the connection's end
    (["Connection timed out during banner exchange", "Connection to 10.0.0.5 port 22 timed out"],
     "no SSH banner in 7s (ssh: Connection timed out during banner exchange); the machine takes "
     "connections but its sshd does not answer (frozen or overloaded): check it, or raise "
     "cluster.ssh.connect_timeout"),
    (["ssh: Could not resolve hostname n9: Name or service not known"],
     "ssh: Could not resolve hostname n9: Name or service not known; fix the name in cluster.hosts "
     "or ssh_config, or add it to DNS or /etc/hosts"),
    (["root@n1: Permission denied (publickey)."], None),   # it got in as far as a login: paramiko explains
    (["Host key verification failed."], None),
])
def test_a_client_that_never_reached_sshd_is_told_in_its_own_words(said, line):
    assert unreached_line(said, 7) == line


@pytest.mark.parametrize("e, line", [
    (paramiko.ssh_exception.NoValidConnectionsError({("10.0.0.5", 22): OSError(errno.EHOSTUNREACH, "x")}),
     "No route to host on port 22; the machine is down or not on this network: check that it is up "
     "and reachable from here"),
    (paramiko.ssh_exception.NoValidConnectionsError({("10.0.0.5", 22): OSError(errno.ECONNREFUSED, "x")}),
     "connection refused on port 22: is sshd running there and the port open?"),
    (paramiko.SSHException("No existing session"),
     "no SSH handshake in 3s (paramiko: No existing session); the machine takes connections but its "
     "sshd does not answer (frozen or overloaded): check it, or raise cluster.ssh.connect_timeout"),
])
def test_paramiko_explains_with_the_systems_words_not_always_refused(e, line):
    """A missing route is not a refusal, a handshake that never finished (a frozen host) is
    not paramiko's "No existing session"."""
    assert explain_connect_error(e, "10.0.0.5", SSH(connect_timeout=3)) == line


def test_paramikos_logged_tracebacks_never_reach_the_console():
    """paramiko logs a transport that died (no banner) as a traceback at ERROR; with no
    handler Python's last resort printed it on mlaunch's console."""
    r = subprocess.run([sys.executable, "-c", "import logging, launcher.transport.ssh_paramiko; logging.getLogger("
                        "'paramiko.transport').error('Exception (client): Error reading SSH protocol banner')"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout == r.stderr == "", r.stderr


def test_no_login_is_tried_on_a_host_whose_session_stopped_answering(tmp_path):
    """The node's client ended with ssh's "not responding": run() (the teardown's) returns at
    once instead of waiting out ConnectTimeout on a frozen host; its client is never run."""
    logins = tmp_path / "logins"
    streams = OpenSSHStreams(SSH())
    streams._argv["a"] = ["/bin/sh", "-c", f"echo x >> {logins}; echo {READY.decode()}; "
                          "echo 'Timeout, server a not responding.' >&2; exit 255"]
    try:
        streams.spawn("")
        assert streams.await_ready(limit(30)) == {}
        node = streams.start("a", "", b"")
        while node.spool.read(node._proc):
            pass
        assert node.wait() == Exit(LOST, lost=True, detail=FROZEN)
        assert streams.run("a", "true", b"", 60) == (LOST, SILENT)
        assert logins.read_text() == "x\n"   # the node's own login only
    finally:
        streams.close()

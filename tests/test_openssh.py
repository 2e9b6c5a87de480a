"""The OpenSSH client as the carrier of node output (launcher/transport/openssh.py): its
command line, the host keys it checks, how its end is read, the login probe."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from launcher.transport.base import LOST, Exit
from launcher import render
from launcher.transport import openssh
from launcher.transport.openssh import READY, STAGED, OpenSSHStreams
from launcher.transport.openssh_running import OpenSSHRunning
from launcher.transport.spool import Spool
from launcher.transport.ssh import _stream_command, bootstrap_command, relay_head
from launcher.spec import SSH
from launcher.spec.hosts import HostAddr

from .helpers import limit



def _child(script: str) -> OpenSSHRunning:
    """A stand-in for the `ssh` child: a shell with the same three pipes."""
    spool = Spool(tempfile.gettempdir())
    proc = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.PIPE, stdout=spool.fd,
                            stderr=subprocess.PIPE, start_new_session=True)
    return OpenSSHRunning(proc, spool)


def _drain(running: OpenSSHRunning) -> bytes:
    """All the session wrote to its spool, once it has ended."""
    out = b""
    while True:
        ended = running.ended()   # before the take: all it wrote is there
        out += (data := running.spool.take())
        if not data and ended:
            return out
        time.sleep(0.01)


def test_argv_reads_paramikos_known_hosts_and_names_every_setting(tmp_path):
    """Strict: the client checks the key against the files paramiko reads (no global file,
    no alias), for the jump host too; every other setting is named."""
    streams = OpenSSHStreams(SSH(user="alice", key_file="~/k%1", config_file=str(tmp_path / "cfg"),
                                 connect_timeout=7, jump_host="bob@gw:2222"))
    try:
        streams.add("n1:2200", HostAddr("n1", port=2200), 2200, ["/k/known"], None)
        streams.add("n2", HostAddr("n2", user="carol"), None, ["/k/a", "/k/b"],
                    (HostAddr("gw", user="bob", port=2222), ["/j/known"]))
        a1, a2 = streams._argv["n1:2200"], streams._argv["n2"]
        assert a1[0] == "ssh" and a1[-2:] == ["--", "n1"] and a2[-2:] == ["--", "n2"]
        for opt in ("-T", "-oBatchMode=yes", "-oEscapeChar=none", "-oStrictHostKeyChecking=yes",
                    "-oServerAliveInterval=2", "-oServerAliveCountMax=3", "-oConnectTimeout=7",
                    "-oLogLevel=INFO",   # the client's words on why it ended, whatever ssh_config says
                    "-oGlobalKnownHostsFile=/dev/null", "-oUserKnownHostsFile=/k/known"):
            assert opt in a1, opt
        assert "-oUserKnownHostsFile=/k/a /k/b" in a2
        assert not [a for a in a1 + a2 if "HostKeyAlias" in a]
        assert a1[a1.index("-p") + 1] == "2200" and "-p" not in a2   # ssh_config decides
        assert a1[a1.index("-l") + 1] == "alice" and a2[a2.index("-l") + 1] == "carol"
        assert a1[a1.index("-i") + 1] == os.path.expanduser("~/k%1")
        assert a1[a1.index("-F") + 1] == str(tmp_path / "cfg")
        (proxy,) = [a for a in a2 if a.startswith("-oProxyCommand=")]
        # the jump host's own files; a literal % is doubled for ssh's own %-expansion
        assert "-oUserKnownHostsFile=/j/known" in proxy and "-W %h:%p -- gw" in proxy
        assert "-oStrictHostKeyChecking=yes" in proxy
        assert "-p 2222" in proxy and "-l bob" in proxy and "k%%1" in proxy
        assert stat.S_IMODE(os.stat(streams._dir).st_mode) == 0o700
    finally:
        streams.close()
    assert not os.path.exists(streams._dir)


def test_not_strict_accepts_new_keys_into_the_runs_own_file_only():
    """strict_host_keys off: paramiko's WarningPolicy accepts an unknown key and writes no
    file; the client accepts it into the run's file, named first (where ssh writes a new
    key), and still refuses a changed one (accept-new, not "no"). Paths as ssh_config words."""
    streams = OpenSSHStreams(SSH(strict_host_keys=False))
    try:
        streams.add("n1", HostAddr("n1"), None, ["/home/a b/known", "/k/100%"], None)
        argv = streams._argv["n1"]
        assert "-oStrictHostKeyChecking=accept-new" in argv
        assert f'-oUserKnownHostsFile={streams._accepted} "/home/a b/known" /k/100%%' in argv
        assert os.path.dirname(streams._accepted) == streams._dir
    finally:
        streams.close()


@pytest.mark.parametrize("said, detail", [
    ("Timeout, server 10.0.0.2 not responding.", "connection lost: not responding (no answer to ssh "
     "keepalives in 6 s: the machine is frozen, or its link is down)"),
    ("Connection to 10.0.0.2 closed by remote host.", "connection lost: closed by the host (ssh: "
     "Connection to 10.0.0.2 closed by remote host.)"),
    ("client_loop: send disconnect: Broken pipe", "connection lost: closed by the host (ssh: "
     "client_loop: send disconnect: Broken pipe)"),
    ("some other end", "connection lost (ssh: some other end)"),
])
def test_exit_255_with_the_clients_own_words_is_a_lost_connection(said, detail):
    """The client's words say how: a host that stopped answering keepalives (frozen, or cut
    off) is told apart from one that closed the connection."""
    r = _child(f"echo node-line; echo '{said}' >&2; echo 'Warning: Permanently added x' >&2; exit 255")
    assert _drain(r) == b"node-line\n"
    assert r.wait() == Exit(LOST, lost=True, detail=detail)


def test_a_nodes_own_exit_codes_pass_through():
    # The node's stderr is merged into its stdout on the node: a silent 255 is the node's own.
    for code in (0, 3, 255):
        r = _child(f"echo x; exit {code}")
        _drain(r)
        assert r.wait() == Exit(code)


def test_heartbeats_reach_the_node_and_close_cuts_the_session():
    r = _child("head -c 3; echo; echo got-3; exec sleep 600")
    for _ in range(3):
        r.heartbeat()
    out = b""
    while b"got-3" not in out:
        out += r.spool.read(r._proc)
    assert out == b"xxx\ngot-3\n"
    pid = r._proc.pid
    r.close()
    _drain(r)
    assert r.wait() == Exit(LOST, lost=True, detail="session cut by mlaunch")
    assert not os.path.exists(f"/proc/{pid}")
    r.heartbeat()   # after the end: nothing raised


def _local_streams(hosts: dict[str, list[str]]) -> OpenSSHStreams:
    """OpenSSHStreams whose "client" per login is a local argv ending in `sh -c`: the
    session's command then runs here, as sshd would run it there."""
    streams = OpenSSHStreams(SSH())
    streams._argv.update(hosts)
    return streams


def test_a_session_logs_in_before_its_script_and_runs_it_when_started():
    streams = _local_streams({"a": ["/bin/sh", "-c"], "b": ["/bin/sh", "-c"]})
    # what a login shell may print first (a banner) is not the node's output
    command = "echo banner-noise; " + bootstrap_command(merge_stderr=True, ready=READY.decode())
    try:
        streams.spawn(command)
        assert streams.await_ready(limit(30)) == {}
        assert set(streams._ready) == {"a", "b"}   # logged in, waiting for their scripts
        runs = {h: streams.start(h, command, render.framed(f"echo on {h}; echo err-{h} >&2; exit 4"))
                for h in ("a", "b")}
        for h, r in runs.items():
            assert _drain(r) == f"on {h}\nerr-{h}\n".encode()   # stderr merged, in order
            assert r.wait() == Exit(4)
        # a session nobody began (`mlaunch exec` starts without staging) logs in when started
        streams._argv["c"] = ["/bin/sh", "-c"]
        late = streams.start("c", command, render.framed("echo late"))
        assert _drain(late) == b"late\n" and late.wait() == Exit(0)
    finally:
        streams.close()


def test_each_session_stages_before_any_starts_and_a_failed_stage_ends_only_its_own(tmp_path):
    """The stage frame runs in the waiting session (templates/stage_step.sh.j2): a host whose
    stage fails says why in one line and its session ends; the others wait, staged, and run
    their scripts when started, with the shell's own umask (the stage's 077 stays in it).
    The relay, waiting from login on, takes its interpreter and frame ahead of the stage frame
    (once: not again with the script) and masks the stage's words too."""
    streams = _local_streams({"a": ["/bin/sh", "-c"], "b": ["/bin/sh", "-c"]})
    command = _stream_command()
    head = relay_head(sys.executable, {"literal": [["s3cret", "*****"]]})
    mask = os.umask(0o022)
    os.umask(mask)
    try:
        streams.spawn(command)
        assert streams.await_ready(limit(30)) == {}
        failed = streams.stage({
            "a": render.framed(f"umask 077; echo noise-before-{STAGED.decode()}; touch {tmp_path}/a"),
            "b": render.framed("echo 'mlaunch: cannot write /x on b (s3cret)' >&2; exit 97")}, limit(30), head)
        said = "*****"
        assert failed == {"b": f"mlaunch: cannot write /x on b ({said})"}
        assert streams.staged("a") and not streams.staged("b") and set(streams._ready) == {"a"}
        assert (tmp_path / "a").exists()
        r = streams.start("a", command, render.framed("umask; echo ran s3cret"))
        assert _drain(r) == b"%04o\nran %s\n" % (mask, said.encode()) and r.wait() == Exit(0)
    finally:
        streams.close()


def test_a_session_that_ends_before_its_ready_line_is_a_problem_and_nothing_is_left():
    streams = _local_streams({"good": ["/bin/sh", "-c"],
                              "bad": ["/bin/sh", "-c", "echo 'Permission denied (publickey).' >&2; exit 255"]})
    command = bootstrap_command(ready=READY.decode())
    streams.spawn(command)
    (problem,) = streams.await_ready(limit(30)).values()
    assert problem.path == "host bad"
    assert problem.message == ("the OpenSSH client (ssh) cannot log in where paramiko did: Permission "
                               "denied (publickey).; fix ssh_config or the key for this host")
    assert streams._ready == {} and streams._pending == {}   # the good host's session ended too
    streams.close()
    assert not os.path.exists(streams._dir)


def test_a_session_ended_before_its_script_finishes_its_login_and_is_not_killed(tmp_path, monkeypatch):
    """A job's logins begin while paramiko connects; when the launch stops before the nodes
    start (a host paramiko refused, a failed preflight), each waiting session's stdin closes
    and it ends on its own once logged in: a login killed half-way can leave the node's
    shell start-up undone (the suite's hosts were left with a stale pyenv lock)."""
    # The sessions' grace, past which they are killed, scaled: two shells on a busy machine.
    monkeypatch.setattr(openssh, "END_GRACE_S", limit(openssh.END_GRACE_S))
    marks = {h: tmp_path / f"{h}.logged-in" for h in ("a", "b")}
    streams = _local_streams({h: ["/bin/sh", "-c", f"sleep 0.3; touch {m}; " + bootstrap_command(
        ready=READY.decode())] for h, m in marks.items()})
    streams.spawn("")
    procs = [proc for proc, _ in streams._pending.values()]
    streams.end_sessions()
    assert all(m.exists() for m in marks.values())     # each login ran to its end
    assert all(p.returncode >= 0 for p in procs)      # none killed
    assert streams._pending == {} and streams._ready == {}
    streams.close()


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client on this machine")
def test_the_real_client_says_in_one_line_why_it_cannot_connect(tmp_path):
    import socket
    # A port bound and never listened on: refused at once, and held while ssh dials (a port
    # freed first could be taken by another process in between).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        streams = OpenSSHStreams(SSH(connect_timeout=5))
        try:
            streams.add(f"127.0.0.1:{port}", HostAddr("127.0.0.1", port=port), port, [os.devnull], None)
            streams.spawn(bootstrap_command(ready=READY.decode()))
            (problem,) = streams.await_ready(limit(30)).values()
        finally:
            streams.close()
    assert problem.path == f"host 127.0.0.1:{port}"
    # ssh's own cause (it never reached an sshd: paramiko is not asked again)
    assert problem.message == f"connection refused on port {port}: is sshd running there and the port open?"
    assert streams.unreached == {f"127.0.0.1:{port}"}

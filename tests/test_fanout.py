"""Fan-out over real sshd hosts (network namespaces): run, stream, fail fast, tear down."""
from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from launcher.transport.base import HEARTBEAT_S, LOST, Exit, heartbeat_period
from launcher.session.outcome import JobResult, NodeOutcome
from launcher.view.present import describe_result

from .helpers import ROOT, limit, mlaunch, script_job, write_spec




def start(tmp_path, spec: dict, name: str = "job.yaml") -> subprocess.Popen:
    """`mlaunch submit` of spec in the background; its stdout and stderr together on .stdout."""
    return subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", write_spec(tmp_path, spec, name)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


READY = re.compile(r"ready rank (\d+) pid (\d+)")   # tests/scripts/fail_or_sleep.py


def wait_ready(proc: subprocess.Popen, n: int, deadline_s: float | None = None) -> dict[str, int]:
    """Read proc's output until n ranks said they are ready (or it ends, or deadline_s passed
    when a line comes): {rank: pid} of those that did."""
    ready: dict[str, int] = {}
    deadline = time.monotonic() + limit(deadline_s) if deadline_s else None
    for line in proc.stdout:
        if m := READY.search(line):
            ready[m.group(1)] = int(m.group(2))
        if len(ready) == n or (deadline and time.monotonic() > deadline):
            break
    return ready


def job_pids(host, keep: set[int]) -> set[int]:
    """Processes left in a host's namespace other than its sshd daemon and `keep`.

    Per namespace, not by name: anything the job started counts, whatever it is called.
    """
    deadline = time.monotonic() + limit(5)
    while True:
        left = {p for p in host.pids() if p != host.sshd_pid and p not in keep}
        left = {p for p in left if not _is_sshd_session(p)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _is_sshd_session(pid: int) -> bool:
    # A closing "sshd: root@pts/0" session process belongs to sshd, not to the job.
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().startswith(b"sshd")
    except OSError:
        return False


def submit(tmp_path, spec: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return mlaunch("submit", write_spec(tmp_path, spec), *args, timeout=timeout)


def node_logs(out_dir: str) -> dict[str, str]:
    return {os.path.basename(p): open(p).read() for p in glob.glob(f"{out_dir}/logs/*/node*.log")}


def check_allreduce(r, world: int, nodes: int, out_dir: str) -> None:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    sums = re.findall(r"rank (\d+)/(\d+) node (\d+) sum (\d+) expected (\d+)", r.stdout)
    assert sorted(int(s[0]) for s in sums) == list(range(world))
    assert all(s[3] == s[4] == str(world * (world - 1) // 2) for s in sums)
    logs = node_logs(out_dir)
    assert len(logs) == nodes
    for name, text in logs.items():
        k = re.match(r"node(\d+)-", name).group(1)
        assert re.search(rf"rank \d+/{world} node {k} sum", text), name


@pytest.mark.multihost
def test_two_hosts_two_procs_allreduce(make_hostset, tmp_path):
    with make_hostset(2) as hs:
        out = str(tmp_path / "out")
        r = submit(tmp_path, script_job([h.ip for h in hs.hosts], 2, "allreduce.py", [], out, hs=hs))
        check_allreduce(r, 4, 2, out)
        # Every line carries its node, host and local rank.
        assert re.search(rf"^\[node1 {hs.hosts[1].ip} local[01]\] rank \d/4 node 1 sum 6", r.stdout, re.M)
        assert "run t-" in r.stdout and "succeeded (exit 0)" in r.stdout


@pytest.mark.multihost
def test_four_hosts_one_proc(make_hostset, tmp_path):
    with make_hostset(4) as hs:
        out = str(tmp_path / "out")
        r = submit(tmp_path, script_job([h.ip for h in hs.hosts], 1, "allreduce.py", [], out, hs=hs))
        check_allreduce(r, 4, 4, out)


@pytest.mark.multihost
def test_failing_rank_tears_down_everything(make_hostset, tmp_path):
    with make_hostset(2) as hs:
        sleeper = hs.hosts[1].popen(["sleep", "600"])
        try:
            spec = script_job([h.ip for h in hs.hosts], 2, "fail_or_sleep.py", ["2", "3", "2"],
                              str(tmp_path / "out"), hs=hs)
            r = submit(tmp_path, spec)
            assert r.returncode == 3, r.stdout[-3000:]
            assert re.search(r"^\[mlaunch\] 1\s+\S+\s+exit 3$", r.stdout, re.M), r.stdout[-2000:]
            assert re.search(r"^\[mlaunch\] 0\s+\S+\s+terminated by mlaunch", r.stdout, re.M), r.stdout[-3000:]
            assert "--- node1" in r.stdout and "rank 2 exiting 3" in r.stdout
            for h in hs.hosts:
                assert job_pids(h, {sleeper.pid}) == set(), f"orphans on {h.name}"
            assert sleeper.poll() is None, "an unrelated process was killed"
        finally:
            sleeper.kill()


@pytest.mark.multihost
def test_sigint_tears_down_exit_130(make_hostset, tmp_path):
    with make_hostset(2) as hs:
        spec = script_job([h.ip for h in hs.hosts], 2, "fail_or_sleep.py", ["-1", "0", "0"],
                          str(tmp_path / "out"), hs=hs)
        proc = start(tmp_path, spec)
        assert len(wait_ready(proc, 4, deadline_s=240)) == 4   # generous: a loaded 2-core machine
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=limit(180))[0]
        assert proc.returncode == 130, rest
        assert "interrupted" in rest
        for h in hs.hosts:
            assert job_pids(h, set()) == set(), f"orphans on {h.name}"


@pytest.mark.multihost
def test_sshd_down_starts_nothing(make_hostset, tmp_path):
    with make_hostset(2) as hs:
        hs.hosts[1].stop_sshd()
        spec = script_job([h.ip for h in hs.hosts], 1, "fail_or_sleep.py", ["-1", "0", "0"],
                          str(tmp_path / "out"), hs=hs)
        r = submit(tmp_path, spec)
        assert r.returncode == 2
        assert f"host {hs.hosts[1].ip}: connection refused on port 22" in r.stderr
        assert "nothing was started anywhere" in r.stderr
        assert hs.hosts[0].ip not in r.stderr.split("nothing was started anywhere")[1]
        assert job_pids(hs.hosts[0], set()) == set()
        assert "ready rank" not in r.stdout


@pytest.mark.multihost
def test_link_down_mid_run_detected(make_hostset, tmp_path):
    """A partitioned node is detected and the rest torn down; the partitioned node, cut
    off from the launcher's heartbeat, ends its own processes while still unreachable."""
    with make_hostset(2) as hs:
        spec = script_job([h.ip for h in hs.hosts], 1, "fail_or_sleep.py", ["-1", "0", "0"],
                          str(tmp_path / "out"), hs=hs, hangup_after_s=6)
        proc = start(tmp_path, spec)
        wait_ready(proc, 2)
        hs.hosts[1].link_down()
        t0 = time.monotonic()
        rest = proc.communicate(timeout=limit(90))[0]
        detect = time.monotonic() - t0
        assert proc.returncode == 255, rest
        assert re.search(rf"node1 {re.escape(hs.hosts[1].ip)}: connection lost", rest), rest
        assert re.search(r"^\[mlaunch\] 0\s+\S+\s+terminated by mlaunch", rest, re.M), rest
        assert job_pids(hs.hosts[0], set()) == set()
        deadline = time.monotonic() + limit(30)
        while job_pids(hs.hosts[1], set()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert job_pids(hs.hosts[1], set()) == set(), "the partitioned node kept running"
        print(f"link down: detected and torn down in {detect:.1f}s; partitioned node ended itself "
              f"{time.monotonic() - t0:.1f}s after the cut")


@pytest.mark.multihost
def test_unknown_host_key_refused(make_hostset, tmp_path):
    with make_hostset(1) as hs:
        empty = tmp_path / "known_hosts"
        empty.write_text("")
        spec = script_job([hs.hosts[0].ip], 1, "allreduce.py", [], str(tmp_path / "out"), hs=hs,
                          ssh={"user": "root", "key_file": hs.key_file, "known_hosts": str(empty)})
        r = submit(tmp_path, spec)
        assert r.returncode == 2
        assert "host key unknown and strict_host_keys is on" in r.stderr
        assert f"ssh-keyscan -p 22 {hs.hosts[0].ip} >> {empty}" in r.stderr
        assert job_pids(hs.hosts[0], set()) == set()


@pytest.mark.multihost
def test_not_strict_runs_with_an_unknown_key_and_refuses_a_changed_one(make_hostset, tmp_path):
    """strict_host_keys: false. An unknown key: paramiko and the stream clients (which log in
    while paramiko connects) both accept it, the job runs, the user's known_hosts is left as it
    was. A changed key: refused before anything starts, the file again unchanged."""
    with make_hostset(2) as hs:
        known = tmp_path / "known_hosts"
        known.write_text("")
        ips = [h.ip for h in hs.hosts]
        ssh = {"user": "root", "key_file": hs.key_file, "known_hosts": str(known), "strict_host_keys": False}
        out = str(tmp_path / "out")
        r = submit(tmp_path, script_job(ips, 1, "allreduce.py", [], out, hs=hs, ssh=ssh))
        check_allreduce(r, 2, 2, out)
        assert known.read_text() == ""
        # another ed25519 key (the hosts' own type) under each host's name
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
        other = (tmp_path / "other.pub").read_text().split()[:2]
        changed = "".join(f"{ip} {other[0]} {other[1]}\n" for ip in ips)
        known.write_text(changed)
        out2 = str(tmp_path / "out2")
        r = submit(tmp_path, script_job(ips, 1, "allreduce.py", [], out2, hs=hs, ssh=ssh))
        assert r.returncode == 2, r.stdout[-2000:] + r.stderr
        assert "host key CHANGED" in r.stderr and "Traceback" not in r.stderr
        assert known.read_text() == changed
        for h in hs.hosts:
            assert job_pids(h, set()) == set()


@pytest.mark.launches
def test_local_executor_allreduce(tmp_path):
    out = str(tmp_path / "out")
    r = submit(tmp_path, script_job(["localhost"], 2, "allreduce.py", [], out))
    check_allreduce(r, 2, 1, out)


@pytest.mark.launches
def test_two_nodes_on_one_host(tmp_path):
    """Two node ranks on localhost, each with its own devices: a real two-node rendezvous."""
    out = str(tmp_path / "out")
    spec = script_job(["localhost", "localhost"], 1, "allreduce.py", [], out,
                      cuda_visible_devices=[[0], [1]])
    r = submit(tmp_path, spec)
    check_allreduce(r, 2, 2, out)
    seen = re.findall(r"rank \d/2 node (\d) sum 1 expected 1 devices (\S+)", r.stdout)
    assert sorted(seen) == [("0", "0"), ("1", "1")], r.stdout[-2000:]


@pytest.mark.multihost
def test_launcher_killed_leaves_no_orphans(make_hostset, tmp_path):
    """SIGKILL to mlaunch (no teardown possible): each node's hang-up guard ends the node."""
    with make_hostset(2) as hs:
        spec = script_job([h.ip for h in hs.hosts], 2, "fail_or_sleep.py", ["-1", "0", "0"],
                          str(tmp_path / "out"), hs=hs)
        proc = start(tmp_path, spec)
        assert len(wait_ready(proc, 4)) == 4
        proc.kill()
        proc.wait()
        for h in hs.hosts:
            assert job_pids(h, set()) == set(), f"orphans on {h.name}"


@pytest.mark.launches
def test_local_launcher_killed_leaves_no_orphans(tmp_path):
    spec = script_job(["localhost"], 2, "fail_or_sleep.py", ["-1", "0", "0"], str(tmp_path / "out"))
    proc = start(tmp_path, spec)
    pids = list(wait_ready(proc, 2).values())
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + limit(10)
    while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(os.path.exists(f"/proc/{p}") for p in pids), "workers survived their launcher"


@pytest.mark.multihost
def test_ssh_config_aliases_and_jump_host(make_hostset, tmp_path):
    """Hosts named by ~/.ssh/config-style aliases; then node 1 reached through node 0."""
    with make_hostset(2) as hs:
        out = str(tmp_path / "out")
        spec = script_job([h.name for h in hs.hosts], 1, "allreduce.py", [], out,
                          ssh={"config_file": hs.ssh_config})
        r = submit(tmp_path, spec)
        check_allreduce(r, 2, 2, out)
        assert f"[node1 {hs.hosts[1].name}]" in r.stdout
        out2 = str(tmp_path / "out2")
        spec = script_job([hs.hosts[1].ip], 1, "allreduce.py", [], out2, hs=hs)
        spec["cluster"]["ssh"]["jump_host"] = f"root@{hs.hosts[0].ip}"
        hs.hosts[1].run(["nft", "add", "table", "inet", "t"], check=True)
        hs.hosts[1].run(["nft", "add", "chain", "inet", "t", "in", "{ type filter hook input priority 0; }"], check=True)
        # Only the jump host may reach node 1's sshd: a direct connection would be dropped.
        hs.hosts[1].run(["nft", "add", "rule", "inet", "t", "in", "tcp", "dport", "22", "ip", "saddr",
                         "!=", hs.hosts[0].ip, "drop"], check=True)
        r = submit(tmp_path, spec)
        check_allreduce(r, 1, 1, out2)


@pytest.mark.multihost
def test_other_mlaunch_job_survives_teardown(make_hostset, tmp_path):
    """Teardown is scoped to one run: a second job on the same hosts keeps running."""
    with make_hostset(2) as hs:
        hosts = [h.ip for h in hs.hosts]
        other_spec = script_job(hosts, 1, "fail_or_sleep.py", ["-1", "0", "0"], str(tmp_path / "other"), hs=hs)
        other = start(tmp_path, other_spec, "other.yaml")
        # Each rank prints its PID in its host (a PID namespace of its own): rank k runs on
        # node k (1 process per node); its PID here:
        pids = [hs.hosts[int(rank)].root_pid(pid) for rank, pid in wait_ready(other, 2).items()]
        assert None not in pids, pids
        try:
            r = submit(tmp_path, script_job(hosts, 1, "fail_or_sleep.py", ["1", "5", "1"],
                                            str(tmp_path / "failing"), hs=hs), timeout=300)
            assert r.returncode == 5, r.stdout[-2000:]
            assert all(os.path.exists(f"/proc/{p}") for p in pids), "the other job was hit"
            assert other.poll() is None
        finally:
            other.send_signal(signal.SIGINT)
            other.communicate(timeout=limit(180))
        assert other.returncode == 130


def hangup_s() -> int:
    """A hangup_after_s short enough that a node busy 2.4 times as long proves the heartbeat
    (every hangup_after_s/4), scaled to the load: a node that heard none for that long would
    rightly end itself, and a stalled launcher on two busy cores must not look like one."""
    return max(5, round(limit(5)))


@pytest.mark.launches
def test_heartbeat_keeps_a_long_node_alive_local(tmp_path):
    """A node quietly busy for longer than hangup_after_s is not mistaken for an orphan."""
    h = hangup_s()
    spec = script_job(["localhost"], 1, "fail_or_sleep.py", ["0", "0", str(round(2.4 * h))],
                      str(tmp_path / "out"), hangup_after_s=h)
    r = submit(tmp_path, spec, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:]
    assert "rank 0 exiting 0" in r.stdout


def test_a_torn_down_node_whose_session_closed_first_is_terminated_by_mlaunch():
    """mlaunch decided the teardown: a node whose session closed before its exit status came
    (a loaded host) is reported as terminated by mlaunch, not as a failure of its own."""
    cut = Exit(LOST, lost=True, detail="connection lost")
    node = NodeOutcome(0, "10.0.0.1", cut, terminated=True)
    assert node.result == "terminated by mlaunch (connection lost before its exit status)"
    assert NodeOutcome(1, "10.0.0.2", cut).result == "connection lost"
    result = JobResult(LOST, [node, NodeOutcome(1, "10.0.0.2", cut)], first_failure=1)
    plan = SimpleNamespace(run_id="r1", log_dir="/tmp/logs", mask=lambda text: text)
    text = describe_result(plan, result)
    assert "--- node0" not in text and "--- node1" in text, text


def test_heartbeat_period_is_a_quarter_of_the_hangup_wait_at_most():
    """The smallest hangup_after_s (5 s) still leaves three late beats before the guard fires."""
    assert heartbeat_period(5) == 1.25
    assert heartbeat_period(12) == 3
    assert heartbeat_period(30) == HEARTBEAT_S == 5
    assert heartbeat_period(3600) == 5


@pytest.mark.multihost
def test_paramikos_sessions_use_an_aead_cipher_when_the_server_has_one(make_hostset):
    """OpenSSH offers AES-GCM: paramiko's transport (the one that explains a failed login)
    settles on it (it checks no HMAC then)."""
    from launcher.transport.ssh import SSHExecutor
    from launcher.spec import SSH
    with make_hostset(1) as hs:
        ip = hs.hosts[0].ip
        ex = SSHExecutor([ip], SSH(user="root", key_file=hs.key_file, known_hosts=hs.known_hosts))
        try:
            assert ex._open_all({ip: ex._connection(ip)}) == []
            transport = ex._conns[ip].client.get_transport()
            assert (transport.local_cipher, transport.remote_cipher) == ("aes128-gcm@openssh.com",) * 2
        finally:
            ex.close()


_CONNECTIONS = "ss -Htn state established | wc -l"   # in the host's own namespace: its ssh links


@pytest.mark.multihost
def test_short_scripts_ride_each_hosts_stream_connection_and_log_in_once_it_is_gone(make_hostset):
    """Connected, every host has one TCP connection (its stream client, the master), and a
    script run there opens none of its own; once that client has ended, a script logs in by
    itself (one connection again: its own), and a host with no master is still reached."""
    from launcher.transport.ssh import SSHExecutor
    from launcher.spec import SSH
    with make_hostset(2) as hs:
        ips = [h.ip for h in hs.hosts]
        ex = SSHExecutor(ips, SSH(user="root", key_file=hs.key_file, known_hosts=hs.known_hosts))
        try:
            assert ex.connect() == []
            for h in hs.hosts:   # the launcher's only link to each host is its stream client's
                assert h.run(["sh", "-c", _CONNECTIONS], capture_output=True, text=True).stdout.split() == ["1"]
            for ip in ips:
                assert ex.run(ip, _CONNECTIONS, 30) == (0, "1\n")   # no second connection
            assert ex.run(ips[0], "echo out; echo err >&2; exit 3", 30) == (3, "out\nerr\n")
            ex._streams.end_sessions()   # every stream client ends: no master left
            assert all(master.poll() is not None for master, _ in ex._streams._masters.values())
            assert ex.run(ips[1], "echo on my own", 30) == (0, "on my own\n")
        finally:
            ex.close()
        for h in hs.hosts:   # nothing of the launcher's is left on a host
            assert h.run(["sh", "-c", _CONNECTIONS], capture_output=True, text=True).stdout.split() == ["0"]


@pytest.mark.multihost
def test_a_host_whose_sshd_allows_one_session_a_connection_still_runs_every_script(make_hostset):
    """MaxSessions 1 (hardened sshd configs): the stream client's own session is the one its
    connection may open, so a script's client is refused there and logs in by itself. The
    script's output is its own, not the client's words about the refusal; its exit passes."""
    from launcher.transport.ssh import SSHExecutor
    from launcher.spec import SSH
    with make_hostset(1, isolated_home=True) as hs:
        h = hs.hosts[0]
        text = open(h.sshd_config).read()
        assert "MaxSessions 100" in text
        with open(h.sshd_config, "w") as f:
            f.write(text.replace("MaxSessions 100", "MaxSessions 1"))
        h.stop_sshd()
        h.start_sshd(timeout=limit(30))   # listening again, with the new setting
        ex = SSHExecutor([h.ip], SSH(user="root", key_file=hs.key_file, known_hosts=hs.known_hosts))
        try:
            assert ex.connect() == []
            assert ex.run(h.ip, "echo out; echo err >&2; exit 3", 30) == (3, "out\nerr\n")
            assert ex.run(h.ip, _CONNECTIONS, 30) == (0, "2\n")   # its own login beside the stream's
        finally:
            ex.close()


@pytest.mark.multihost
def test_heartbeat_keeps_a_long_node_alive_ssh(make_hostset, tmp_path):
    with make_hostset(1) as hs:
        h = hangup_s()
        spec = script_job([hs.hosts[0].ip], 1, "fail_or_sleep.py", ["0", "0", str(round(2.4 * h))],
                          str(tmp_path / "out"), hs=hs, hangup_after_s=h)
        r = submit(tmp_path, spec, timeout=300)
        assert r.returncode == 0, r.stdout[-2000:]
        assert "rank 0 exiting 0" in r.stdout


@pytest.mark.multihost
def test_a_client_that_cannot_log_in_starts_nothing(make_hostset, tmp_path):
    """Node output travels through the OpenSSH client (transport/openssh.py), which logs in on
    its own: an ssh_config that lets paramiko in but not the client (password only, and no
    prompt in batch mode) is one line per host and exit 2 before any node starts."""
    with make_hostset(2) as hs:
        cfg = tmp_path / "ssh_config"
        cfg.write_text(open(hs.ssh_config).read() + "\nHost *\n  PreferredAuthentications password\n")
        out = str(tmp_path / "out")
        spec = script_job([h.ip for h in hs.hosts], 1, "allreduce.py", [], out, hs=hs)
        spec["cluster"]["ssh"]["config_file"] = str(cfg)
        r = submit(tmp_path, spec)
        assert r.returncode == 2, r.stdout[-2000:] + r.stderr
        for h in hs.hosts:
            (line,) = [ln for ln in r.stderr.splitlines() if f"host {h.ip}:" in ln]
            assert "the OpenSSH client (ssh) cannot log in where paramiko did: " in line, line
            assert "Permission denied" in line, line
            assert job_pids(h, set()) == set()
        assert "Traceback" not in r.stderr and not glob.glob(f"{out}/logs/*/node*.log")

"""Tests of the namespace+sshd multi-host fixture (tests/hosts.py)."""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
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

PY = sys.executable  # absolute: sshd sessions get a minimal PATH
GETHOST = "import socket; print(socket.gethostbyname(socket.gethostname()))"


def ssh(hs, host, cmd: str, *, timeout: float = 30, connect_timeout: int = 10,
        ) -> subprocess.CompletedProcess:
    return subprocess.run(hs.ssh_argv(host, connect_timeout=connect_timeout) + [cmd],
                          capture_output=True, text=True, timeout=timeout)


def netns_list() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def link_names() -> set[str]:
    return H._existing_links()


def pid_gone(pid: int) -> bool:
    """Dead (gone, or a zombie waiting for its parent to reap it)."""
    return not H._pid_alive(pid)


def snapshot(hs) -> dict:
    return {
        "ns": [h.ns for h in hs.hosts],
        "links": [hs.bridge] + [h.veth for h in hs.hosts],
        "etc": [os.path.join("/etc/netns", h.ns) for h in hs.hosts],
        # with each host's PID 1 and its holder: a PID 1 ends once every process of its PID
        # namespace is reaped, so a test's own Popen children must be waited for first.
        "pids": sorted(set().union(*(h.pids() | h.machine_pids() for h in hs.hosts))),
        "sshd": [h.sshd_pid for h in hs.hosts],
        "dir": hs.dir,
        "tag": hs.tag,
    }


def assert_all_gone(snap: dict) -> None:
    assert not set(snap["ns"]) & netns_list()
    assert not set(snap["links"]) & link_names()
    for d in snap["etc"]:
        assert not os.path.exists(d), d
    # A namespace's last processes are SIGKILLed by the kernel as its PID 1 ends; on a loaded
    # machine one may take a moment to die after the teardown returned: waited for, bounded.
    deadline = time.monotonic() + limit(10)
    for pid in snap["pids"] + snap["sshd"]:
        while not pid_gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid_gone(pid), f"pid {pid} survived teardown"
    assert not os.path.exists(snap["dir"])
    assert not os.path.exists(H._reg_path(snap["tag"]))


def test_each_host_answers_ssh_with_own_name_and_ip(hosts2):
    procs = [subprocess.Popen(
        hosts2.ssh_argv(h) + [f"hostname; {PY} -c '{GETHOST}'"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for h in hosts2]
    names = []
    for h, p in zip(hosts2, procs):
        out, err = p.communicate(timeout=limit(30))
        assert p.returncode == 0, err
        # Own hostname; it resolves to the host's bridge IP, not loopback.
        assert out.split() == [h.name, h.ip]
        names.append(out.split()[0])
    assert len(set(names)) == 2 and os.uname().nodename not in names
    # Host.run sees the same name and resolution; peers resolve by name too.
    a, b = hosts2.hosts
    assert a.run(["hostname"]).stdout.strip() == a.name
    assert a.run(["/usr/bin/hostname"], env={}).stdout.strip() == a.name
    r = a.run([PY, "-c", f"{GETHOST}; print(socket.gethostbyname({b.name!r}))"])
    assert r.stdout.split() == [a.ip, b.ip], r.stderr
    # The generated ssh_config works with the host alias.
    r = subprocess.run(["ssh", "-F", hosts2.ssh_config, b.name, "hostname"],
                       capture_output=True, text=True, timeout=limit(30))
    assert r.returncode == 0 and r.stdout.strip() == b.name, r.stderr


def test_host_a_reaches_host_b_over_tcp(hosts2):
    a, b = hosts2.hosts
    token = secrets.token_hex(8)
    server = textwrap.dedent(f"""
        import socket, sys
        s = socket.socket()
        s.bind(({b.ip!r}, 0))
        s.listen(1)
        print(s.getsockname()[1], flush=True)
        s.settimeout({limit(10)})
        c, addr = s.accept()
        c.sendall(({token!r} + " " + addr[0]).encode())
        c.close()
    """)
    srv = b.popen([PY, "-c", server], stdout=subprocess.PIPE)
    try:
        port = int(srv.stdout.readline())
        client = (f"import socket; c = socket.create_connection(({b.ip!r}, {port}), {limit(5)});"
                  "print(c.recv(100).decode())")
        r = a.run([PY, "-c", client], timeout=limit(20))
        assert r.returncode == 0, r.stderr
        # B saw the connection come from A's own address.
        assert r.stdout.split() == [token, a.ip]
        assert srv.wait(limit(10)) == 0
    finally:
        srv.kill()
        srv.wait()
    # And a host can ssh to a peer (what a launcher on node 0 would do).
    r = a.run(hosts2.ssh_argv(b) + ["hostname"], timeout=limit(30))
    assert r.returncode == 0 and r.stdout.strip() == b.name, r.stderr


def test_hosts_have_no_route_outside_subnet(hosts2):
    h = hosts2[0]
    routes = h.run(["ip", "-4", "route", "show"]).stdout
    assert "default" not in routes
    r = h.run([PY, "-c", "import socket; socket.create_connection(('192.0.2.1', 9), 2)"])
    assert r.returncode != 0 and "unreachable" in r.stderr.lower()


def test_pids_lists_processes_in_host(hosts2):
    h = hosts2[0]
    p = h.popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + limit(5)
        while p.pid not in h.pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.pid in h.pids()
        assert h.sshd_pid in h.pids()
        assert p.pid not in hosts2[1].pids()
        # Same answer as the /proc scan used by teardown, but the host's PID 1 and its
        # holder. The two are separate scans, so a short-lived process (sshd's child for a
        # probe, an nsenter on its way in) may be in one and not the other: a process seen
        # in the network namespace by a scan before and one after pids() must be in it, and
        # one pids() adds beyond the network namespace must be in the host's PID namespace.
        def agree() -> bool:
            before = H._netns_pids([h.ns])[h.ns] - h.machine_pids()
            mine = h.pids()
            after = H._netns_pids([h.ns])[h.ns] - h.machine_pids()
            extra = mine - before - after
            return (before & after) <= mine and all(
                h.inner_pid(q) is not None or not os.path.exists(f"/proc/{q}") for q in extra)
        deadline = time.monotonic() + limit(3)
        while not agree() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agree()
        assert h.machine_pids() <= H._netns_pids([h.ns])[h.ns] and len(h.machine_pids()) == 2
    finally:
        p.kill()
        p.wait()


def test_stop_sshd_refuses_fast_and_start_sshd_restores(hosts2):
    h = hosts2[0]
    old = h.sshd_pid
    h.stop_sshd()
    assert h.sshd_pid is None and pid_gone(old)
    r = ssh(hosts2, h, "hostname", connect_timeout=20)
    # Refused outright (RST), not a timeout: ssh says which. Under load a connection can still
    # reach a socket the stopped sshd's last child was closing, and is reset rather than
    # refused: an RST all the same.
    refused = "Connection refused" in r.stderr or "reset by peer" in r.stderr
    assert r.returncode == 255 and refused, r
    h.start_sshd()
    assert h.sshd_pid not in (None, old) and h.sshd_pid in h.pids()
    r = ssh(hosts2, h, "hostname")
    assert r.returncode == 0 and r.stdout.strip() == h.name, (r, h.sshd_log_tail())


def test_link_down_makes_host_unreachable(hosts2):
    h, other = hosts2.hosts
    h.link_down()
    # Unreachable from its peer too (checked concurrently to save time).
    peer = other.popen([PY, "-c",
                        f"import socket; socket.create_connection(({h.ip!r}, 22), 1)"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    r = ssh(hosts2, h, "hostname", connect_timeout=1, timeout=10)
    assert r.returncode == 255
    assert "timed out" in r.stderr.lower(), r.stderr
    _, err = peer.communicate(timeout=limit(10))
    assert peer.returncode != 0 and "timed out" in err, err
    h.link_up()
    with socket.create_connection((h.ip, 22), limit(5)) as c:
        assert c.recv(64).startswith(b"SSH-2.0-")


def test_many_concurrent_sessions_isolated_home(make_hostset):
    with make_hostset(1, isolated_home=True) as hs:
        h = hs[0]
        assert h.home != "/root"
        procs = [subprocess.Popen(hs.ssh_argv(h) + ["sleep 0.2; hostname; echo $HOME"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
                 for _ in range(12)]
        outs = [p.communicate(timeout=limit(30)) for p in procs]
        assert [p.returncode for p in procs] == [0] * 12, [e for _, e in outs]
        assert {tuple(o.split()) for o, _ in outs} == {(h.name, h.home)}


def test_teardown_is_complete(make_hostset):
    with make_hostset(2) as hs:
        bg = hs[1].popen(["sleep", "60"])
        r = subprocess.Popen(hs.ssh_argv(hs[0]) + ["sleep 60"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + limit(5)
        while len(hs[0].pids()) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)  # sshd + session sshd + sleep
        snap = snapshot(hs)
        assert bg.pid in snap["pids"] and len(snap["pids"]) >= 4
        assert os.path.exists(os.path.join("/etc/netns", hs[0].ns, "hosts"))
    assert bg.wait(limit(5)) in (-signal.SIGTERM, -signal.SIGKILL)   # ended by the teardown
    assert_all_gone(snap)
    assert r.wait(limit(10)) != 0  # its session was killed under it


def test_teardown_on_exception(make_hostset):
    with pytest.raises(ZeroDivisionError):
        with make_hostset(1) as hs:
            p = hs[0].popen(["sleep", "60"])
            time.sleep(0.05)
            snap = snapshot(hs)
            1 / 0
    assert p.wait(limit(5)) in (-signal.SIGTERM, -signal.SIGKILL)   # ended by the teardown
    assert_all_gone(snap)


def test_two_hostsets_at_once_do_not_collide(make_hostset):
    with make_hostset(1, isolated_home=True) as a, \
            make_hostset(1, isolated_home=True) as b:
        assert a.subnet != b.subnet and a.bridge != b.bridge
        assert a[0].name != b[0].name
        for hs in (a, b):
            r = ssh(hs, hs[0], "hostname")
            assert r.returncode == 0 and r.stdout.strip() == hs[0].name, r.stderr
        # Separate subnets: a host of A cannot reach a host of B.
        r = a[0].run([PY, "-c",
                      f"import socket; socket.create_connection(({b[0].ip!r}, 22), 1)"])
        assert r.returncode != 0


def test_four_hosts_full_mesh(make_hostset):
    with make_hostset(4, isolated_home=True) as hs:
        assert len({h.ip for h in hs}) == 4
        procs = {h.name: subprocess.Popen(hs.ssh_argv(h) + ["hostname"],
                                          stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True)
                 for h in hs}
        for name, p in procs.items():
            out, err = p.communicate(timeout=limit(30))
            assert p.returncode == 0 and out.strip() == name, err
        # Every host reads every peer's SSH banner.
        peers = [h.ip for h in hs]
        mesh = ("import socket, sys\n"
                f"for ip in {peers!r}:\n"
                "    c = socket.create_connection((ip, 22), 3)\n"
                "    assert c.recv(64).startswith(b'SSH-2.0-'), ip\n"
                "    c.close()\n"
                "print('ok')\n")
        procs = [h.popen([PY, "-c", mesh], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE) for h in hs]
        for p in procs:
            out, err = p.communicate(timeout=limit(30))
            assert p.returncode == 0 and out.strip() == "ok", err


def test_stale_resources_of_crashed_run_are_cleaned():
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    child = textwrap.dedent(f"""
        import json, os, signal, subprocess, sys
        sys.path.insert(0, {tests_dir!r})
        import hosts
        cm = hosts.make_hosts(2)
        hs = cm.__enter__()
        p = hs[0].popen(["sleep", "60"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        print(json.dumps({{"tag": hs.tag, "ns": [h.ns for h in hs],
                          "links": [hs.bridge] + [h.veth for h in hs],
                          "sshd": [h.sshd_pid for h in hs], "bg": p.pid,
                          "dir": hs.dir}}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = subprocess.run([PY, "-c", child], capture_output=True, text=True, timeout=limit(60))
    assert r.returncode == -signal.SIGKILL, r.stderr
    info = json.loads(r.stdout)
    # The crash left everything behind ...
    assert set(info["ns"]) <= netns_list()
    assert not pid_gone(info["sshd"][0])
    cleaned = H.cleanup_stale()
    assert info["tag"] in cleaned
    snap = {"ns": info["ns"], "links": info["links"],
            "etc": [os.path.join("/etc/netns", n) for n in info["ns"]],
            "pids": [info["bg"]], "sshd": info["sshd"], "dir": info["dir"],
            "tag": info["tag"]}
    assert_all_gone(snap)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_make_hosts_timing(n, capsys):
    t0 = time.monotonic()
    with H.make_hosts(n) as hs:
        t_up = time.monotonic() - t0
        assert [h.run(["hostname"]).stdout.strip() for h in hs] == [h.name for h in hs]
        for h in hs:  # every sshd answers with its banner from the root ns
            with socket.create_connection((h.ip, 22), limit(5)) as c:
                assert c.recv(64).startswith(b"SSH-2.0-")
        t1 = time.monotonic()
    t_down = time.monotonic() - t1
    with capsys.disabled():
        print(f"\n[hosts] make_hosts({n}): up {t_up:.3f}s, teardown {t_down:.3f}s")


def test_host_sets_leave_room_in_the_shared_arp_table(make_hostset):
    """Every namespace's neighbours count against one kernel table: a built set leaves its
    thresholds at least NEIGH_THRESH, so that a 64-host mesh or a day of test runs does not
    overflow it (the symptom: dials that time out or find no route)."""
    from tests.hostkit.sshd import NEIGH_THRESH
    with make_hostset(2):
        for k, want in NEIGH_THRESH.items():
            assert int(open(f"/proc/sys/net/ipv4/neigh/default/gc_thresh{k}").read()) >= want

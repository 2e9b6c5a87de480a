"""Spare hosts resolved through the ssh config and probed at submit (issue 50): a spare that is
a node under another name is refused before anything starts; a spare that cannot be reached is
one warning line with ssh's own cause and an event, and the run goes on."""
from __future__ import annotations

import glob
import json
import os
import re
import threading

import pytest

from launcher.transport.ssh_probe import Resolved
from launcher.plan.launch_plan import build_plan
from launcher.backends.ssh import spares
from launcher.spec import validate

from .helpers import limit, mlaunch, script_job, write_spec
from .test_fanout import job_pids, start, submit

FIX = "a spare must be a machine the job does not use: remove it or name another"


def alias_config(tmp_path, alias: str, ip: str) -> str:
    """An ssh config file in which alias is the machine at ip."""
    path = tmp_path / "ssh_config"
    path.write_text(f"Host {alias}\n    HostName {ip}\n")
    return str(path)


@pytest.mark.multihost
def test_a_spare_that_is_a_node_under_an_ssh_alias_is_refused_and_nothing_starts(make_hostset, tmp_path):
    with make_hostset(2) as hs:
        a, b = hs.hosts
        released = tmp_path / "released"
        released.write_text("")   # were the job started, it would end at once
        job = script_job([a.ip, b.ip], 1, "wait_for_file.py", [str(released)], str(tmp_path / "out"),
                         hs=hs, spare_hosts=["n1x"])
        job["cluster"]["ssh"]["config_file"] = alias_config(tmp_path, "n1x", b.ip)
        r = submit(tmp_path, job)
        assert r.returncode == 2, r.stdout[-3000:] + r.stderr
        assert r.stderr.splitlines() == [
            f"mlaunch: cluster.spare_hosts[0]: 'n1x' is node 1 ('{b.ip}') under another name: both "
            f"resolve to {b.ip} port 22 through the ssh config; {FIX}"], r.stderr
        assert "Traceback" not in r.stdout and "waiting for" not in r.stdout
        assert job_pids(a, set()) == set() and job_pids(b, set()) == set()


@pytest.mark.multihost
def test_an_unreachable_spare_is_a_warning_with_sshs_cause_and_the_run_goes_on(make_hostset, tmp_path):
    """Two nodes and two spares: one spare's sshd is stopped, the other's link is down. Each is
    one warning line naming it and what ssh said, and a spare_unreachable event; the nodes,
    held until both warnings have come, then run to exit 0."""
    with make_hostset(4) as hs:
        a, b, refused, cut = hs.hosts
        refused.stop_sshd()
        cut.link_down()
        out, release = str(tmp_path / "out"), str(tmp_path / "release")
        job = script_job([a.ip, b.ip], 1, "wait_for_file.py", [release], out, hs=hs,
                         spare_hosts=[refused.ip, cut.ip])
        proc = start(tmp_path, job)
        safety = threading.Timer(limit(180), lambda: open(release, "w").close())   # never a hang
        safety.start()
        seen = []
        try:
            for line in proc.stdout:
                seen.append(line)
                text = "".join(seen)
                if text.count("waiting for") == 2 and text.count("[mlaunch] spare host") == 2:
                    break
            open(release, "w").close()
            rest = proc.communicate(timeout=limit(120))[0]
        finally:
            safety.cancel()
        text = "".join(seen) + rest
        assert proc.returncode == 0, text[-4000:]
        after = ("; a restart that needs a spare skips it while it stays so: fix its network, "
                 "sshd or key, or remove it from cluster.spare_hosts")
        assert (f"[mlaunch] spare host {refused.ip} cannot be reached: ssh: connect to host "
                f"{refused.ip} port 22: Connection refused{after}\n") in text, text[-4000:]
        assert re.search(rf"^\[mlaunch\] spare host {re.escape(cut.ip)} cannot be reached: ssh: connect "
                         rf"to host {re.escape(cut.ip)} port 22: (No route to host|Connection timed "
                         rf"out){re.escape(after)}$", text, re.M), text[-4000:]
        assert text.count("released") == 2 and "succeeded (exit 0)" in text, text[-4000:]
        (path,) = glob.glob(f"{out}/logs/*/events.jsonl")
        events = [json.loads(ln) for ln in open(path)]
        causes = {e["host"]: e["cause"] for e in events if e["event"] == "spare_unreachable"}
        assert causes[refused.ip] == f"ssh: connect to host {refused.ip} port 22: Connection refused"
        assert sorted(causes) == sorted([refused.ip, cut.ip]) and "port 22: " in causes[cut.ip]
        assert events[-1]["event"] == "run_end" and events[-1]["code"] == 0


def test_mlaunch_check_refuses_an_aliased_spare_before_it_connects(tmp_path):
    """`mlaunch check` resolves the spares as submit does; the hosts (TEST-NET-1, never
    answered) are not contacted: the refusal is the only line."""
    data = {"name": "t", "trainer": "script", "script": {"path": "/abs/train.py"},
            "cluster": {"hosts": ["192.0.2.1", "192.0.2.2"], "gpus_per_node": 1,
                        "spare_hosts": ["192.0.2.3", "n0x"],
                        "ssh": {"config_file": alias_config(tmp_path, "n0x", "192.0.2.1")}}}
    r = mlaunch("check", write_spec(tmp_path, data))
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.splitlines() == [
        "mlaunch: cluster.spare_hosts[1]: 'n0x' is node 0 ('192.0.2.1') under another name: both "
        f"resolve to 192.0.2.1 port 22 through the ssh config; {FIX}"], r.stderr


def plan_of(hosts: list[str], spare_hosts: list[str]):
    return build_plan(validate({"name": "t", "trainer": "script", "script": {"path": "/abs/train.py"},
                                "cluster": {"hosts": hosts, "gpus_per_node": 1,
                                            "spare_hosts": spare_hosts}}), run_id="r")


def test_same_machine_by_dns_by_another_spare_and_not_behind_another_proxy():
    """The comparison itself: a spare whose name DNS gives a node's address is that node; a
    spare on an earlier spare's machine is refused as a repeat; the same hostname behind a
    jump host is another network's machine; another port is another sshd."""
    plan = plan_of(["n0", "n1"], ["gpu1.example", "s1", "s1x", "far", "n1:2222"])
    direct = lambda name, port=22: Resolved(name, port, "", ())  # noqa: E731
    resolved = {"n0": direct("10.0.0.1"), "n1": direct("n1.lan"), "gpu1.example": direct("gpu1.example"),
                "s1": direct("10.0.0.7"), "s1x": direct("10.0.0.7"),
                "far": Resolved("10.0.0.1", 22, "gw", ()), "n1:2222": direct("n1.lan", 2222)}
    addresses = {"n1": {"10.0.0.2"}, "gpu1.example": {"10.0.0.2", "fd00::2"}}
    assert [str(p) for p in spares.same_machines(plan, resolved, addresses)] == [
        f"cluster.spare_hosts[0]: 'gpu1.example' is node 1 ('n1') under another name: both "
        f"resolve to 10.0.0.2 port 22 through DNS; {FIX}",
        "cluster.spare_hosts[2]: 's1x' is cluster.spare_hosts[1] ('s1') under another name: both "
        "resolve to 10.0.0.7 port 22 through the ssh config; list each spare machine once"]

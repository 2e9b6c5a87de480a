"""Detached runs on real sshd hosts: submit -d, the supervisor, ps / logs / stop / attach."""
from __future__ import annotations

import os
import re
import signal
import time

import pytest

from launcher.record.events import read_events

from .helpers import limit, script_job, write_spec
from .procs import job_pids as local_pids
from .runs import Runs, hang_up, submit_in_terminal
from .test_fanout import job_pids


@pytest.fixture
def runs(tmp_path) -> Runs:
    return Runs(str(tmp_path / "home"))


def sleepers(hs, out: str, **cluster) -> dict:
    """2 hosts × 2 ranks that print `ready rank R` and sleep until torn down."""
    return script_job([h.ip for h in hs.hosts], 2, "fail_or_sleep.py", ["-1", "0", "0"], out,
                      hs=hs, **cluster)


def all_gone(hs, keep: set[int] = frozenset()) -> dict[str, set[int]]:
    return {h.name: job_pids(h, set(keep)) for h in hs.hosts}


@pytest.mark.multihost
def test_detached_run_survives_hangup_and_completes(make_hostset, tmp_path, runs):
    with make_hostset(2) as hs:
        out = str(tmp_path / "out")
        spec = script_job([h.ip for h in hs.hosts], 2, "ticker.py", ["60", "0.2", "0"], out, hs=hs)
        shell, run_id = submit_in_terminal(runs, write_spec(tmp_path, spec))
        hang_up(shell)
        assert runs.run(run_id)["state"] == "running"
        runs.wait_console(run_id, r"tick rank \d node 1 i 5 ")
        follower = runs.popen("logs", "-f", run_id[:len(run_id) - 3])  # a unique prefix
        row = runs.wait_state(run_id, ("succeeded", "failed", "stopped", "lost"))
        followed, err = follower.communicate(timeout=limit(60))
        assert row["state"] == "succeeded" and row["exit_code"] == 0, row
        assert follower.returncode == 0, err
        assert re.search(r"tick rank [0-3] node [01] i 59 ", followed), followed[-2000:]
        assert f"job {run_id} succeeded (exit 0)" in followed
        node1 = runs.cli("logs", run_id, "--node", "1")
        assert node1.returncode == 0, node1.stderr
        ticks = [ln for ln in node1.stdout.splitlines() if " tick rank " in ln]
        assert len(ticks) == 120  # 2 ranks x 60 lines, all of node 1's, each prefixed
        assert all(ln.startswith(f"[node1 {hs.hosts[1].ip} local") and " node 1 i " in ln
                   for ln in ticks), ticks[:3]
        assert all_gone(hs) == {h.name: set() for h in hs.hosts}


@pytest.mark.multihost
def test_stop_leaves_nothing_and_spares_a_bystander(make_hostset, tmp_path, runs):
    with make_hostset(2) as hs:
        bystander = hs.hosts[1].popen(["sleep", "600"])
        try:
            run_id = runs.detach(tmp_path, sleepers(hs, str(tmp_path / "out")))
            runs.wait_console(run_id, r"ready rank \d", count=4)
            r = runs.cli("stop", run_id)
            assert r.returncode == 0, r.stdout + r.stderr
            assert "0 processes left on 2 hosts" in r.stdout
            assert all_gone(hs, {bystander.pid}) == {h.name: set() for h in hs.hosts}
            assert bystander.poll() is None, "stop killed an unrelated process"
            row = runs.run(run_id)
            assert row["state"] == "stopped" and row["exit_code"] == 130, row
        finally:
            bystander.kill()


def stream_clients(pid: int) -> list[int]:
    """The OpenSSH clients (transport/openssh.py) that process pid started: its children whose
    program is ssh."""
    out = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{d}/stat").read()
            argv0 = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")[0]
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and os.path.basename(argv0) == b"ssh":
            out.append(int(d))
    return out


@pytest.mark.multihost
def test_supervisor_killed_is_lost_and_stop_still_cleans(make_hostset, tmp_path, runs):
    with make_hostset(2) as hs:
        # A supervisor gone while its links hang (its ssh clients frozen, so that no end of
        # stream reaches the nodes): the nodes keep running until the hang-up guard's silence
        # limit (600 s), and stop reaches them directly. (A supervisor killed with its links
        # intact closes the streams, and each node ends its own processes: run b below.)
        a = runs.detach(tmp_path, sleepers(hs, str(tmp_path / "a"), hangup_after_s=600), name="a.yaml")
        runs.wait_console(a, r"ready rank \d", count=4)
        supervisor = runs.run(a)["supervisor_pid"]
        clients = stream_clients(supervisor)
        assert len(clients) == 2, clients   # one per node
        try:
            for pid in clients:
                os.kill(pid, signal.SIGSTOP)
            os.kill(supervisor, signal.SIGKILL)
            assert runs.wait_state(a, ("lost",), timeout=10)["state"] == "lost"
            assert local_pids(a), "the job should still run on the nodes (hang-up guard: 600 s)"
            r = runs.cli("stop", a)
        finally:
            for pid in clients:
                os.kill(pid, signal.SIGKILL)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "supervisor is lost" in r.stdout and "0 processes left" in r.stdout
        assert all_gone(hs) == {h.name: set() for h in hs.hosts}
        # The record stays what happened (lost, no exit code); the stop is added to it.
        row = runs.run(a)
        assert (row["state"], row["exit_code"], row["stop_requested"]) == ("lost", None, True), row
        assert a not in {x["id"] for x in runs.ps(all_=False)}
        events = read_events(os.path.join(row["log_dir"], "events.jsonl"))
        assert events[-1]["event"] == "stop" and events[-1]["after"] == "lost", events[-1]
        assert events[-1]["left"] == 0 and events[-1]["clean"] is True
        # Without stop: each node's hang-up guard ends its own processes.
        b = runs.detach(tmp_path, sleepers(hs, str(tmp_path / "b"), hangup_after_s=6), name="b.yaml")
        runs.wait_console(b, r"ready rank \d", count=4)
        os.kill(runs.run(b)["supervisor_pid"], signal.SIGKILL)
        deadline = time.monotonic() + limit(60)
        while local_pids(b) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not local_pids(b), "the hang-up guards did not end the job"
        assert all_gone(hs) == {h.name: set() for h in hs.hosts}
        assert runs.run(b)["state"] == "lost"


@pytest.mark.multihost
def test_two_detached_runs_on_the_same_hosts(make_hostset, tmp_path, runs):
    with make_hostset(2) as hs:
        a = runs.detach(tmp_path, sleepers(hs, str(tmp_path / "a")), name="a.yaml")
        b = runs.detach(tmp_path, sleepers(hs, str(tmp_path / "b")), name="b.yaml")
        for run_id in (a, b):
            runs.wait_console(run_id, r"ready rank \d", count=4)
        listed = {r["id"]: r["state"] for r in runs.ps(all_=False)}
        assert listed == {a: "running", b: "running"}
        table = runs.cli("ps").stdout
        assert a in table and b in table
        r = runs.cli("stop", a)
        assert r.returncode == 0, r.stdout + r.stderr
        assert not local_pids(a)
        assert len([p for p in local_pids(b)]) >= 4, "stopping one run touched the other"
        assert {r["id"]: r["state"] for r in runs.ps()} == {a: "stopped", b: "running"}
        assert runs.cli("stop", b).returncode == 0
        assert all_gone(hs) == {h.name: set() for h in hs.hosts}


@pytest.mark.multihost
def test_attach_then_ctrl_c_leaves_the_run_running(make_hostset, tmp_path, runs):
    with make_hostset(2) as hs:
        # Ranks that print a tick every 0.2 s for 10 minutes: the run keeping on is its new ticks.
        spec = script_job([h.ip for h in hs.hosts], 2, "ticker.py", ["3000", "0.2", "0"],
                          str(tmp_path / "out"), hs=hs)
        run_id = runs.detach(tmp_path, spec)
        runs.wait_console(run_id, r"tick rank \d", count=4)
        att = runs.popen("attach", run_id)
        first = att.stdout.readline()
        assert "[node" in first or "[mlaunch]" in first, first
        att.send_signal(signal.SIGINT)
        rest, err = att.communicate(timeout=limit(30))
        assert att.returncode == 0, err
        assert "Ctrl-C detaches, the run keeps running" in err
        assert f"detached from run {run_id}; it keeps running" in err
        # Every rank writes on after the detach: each one's tick 20 beyond its count then.
        seen = runs.wait_console(run_id, r"tick rank \d", count=1)
        for rank in range(4):
            last = max(int(i) for i in re.findall(rf"tick rank {rank} node \S+ i (\d+)", seen))
            runs.wait_console(run_id, rf"tick rank {rank} node \S+ i {last + 20} ")
        assert runs.run(run_id)["state"] == "running"
        assert len(local_pids(run_id)) >= 4
        assert runs.cli("stop", run_id).returncode == 0
        assert all_gone(hs) == {h.name: set() for h in hs.hosts}


@pytest.mark.multihost
def test_stop_of_a_foreground_run_by_job_name(make_hostset, tmp_path, runs):
    """A foreground run is registered too; `stop <job name>` from another terminal is its Ctrl-C."""
    with make_hostset(2) as hs:
        fg = runs.popen("submit", write_spec(tmp_path, sleepers(hs, str(tmp_path / "out"))),
                        "--no-preflight")
        ready = set()
        for line in fg.stdout:
            ready.update(re.findall(r"ready rank (\d+)", line))
            if len(ready) == 4:
                break
        row = runs.ps(all_=False)[0]
        assert row["state"] == "running" and not row["detached"], row
        r = runs.cli("stop", "t")
        assert r.returncode == 0, r.stdout + r.stderr
        rest, _ = fg.communicate(timeout=limit(60))
        assert fg.returncode == 130 and "interrupted: tearing down" in rest, rest[-2000:]
        assert runs.run(row["id"])["state"] == "stopped"
        assert all_gone(hs) == {h.name: set() for h in hs.hosts}


@pytest.mark.multihost
def test_stop_after_a_spare_took_a_nodes_place_reaches_the_spare(make_hostset, tmp_path, runs):
    """2 nodes + 1 spare, detached: node 1's link is cut, the restart runs on the spare; the
    supervisor is then lost (its links frozen, as above) and node 1's link comes back. `stop`
    reaches every machine the run used, the spare included (the registry's attempts name it;
    the spec names only the first attempt's hosts): nothing is left on any of the 3, by PID."""
    with make_hostset(3) as hs:
        a, b, spare = hs.hosts
        spec = script_job([a.ip, b.ip], 2, "fail_or_sleep.py", ["-1", "0", "0"], str(tmp_path / "out"),
                          hs=hs, hangup_after_s=600, spare_hosts=[spare.ip])
        spec["max_restarts"], spec["restart_backoff_s"] = 1, 0
        run_id = runs.detach(tmp_path, spec)
        runs.wait_console(run_id, r"ready rank \d", count=4)
        b.link_down()
        text = runs.wait_console(run_id, r"ready rank \d", count=8, timeout=300)
        assert f"host replaced: node1 {b.ip} -> spare {spare.ip}" in text, text[-3000:]
        assert job_pids(spare, set()), "the restart should run on the spare"
        supervisor = runs.run(run_id)["supervisor_pid"]
        clients = stream_clients(supervisor)
        try:
            for pid in clients:
                os.kill(pid, signal.SIGSTOP)
            os.kill(supervisor, signal.SIGKILL)
            assert runs.wait_state(run_id, ("lost",), timeout=10)["state"] == "lost"
            b.link_up()
            r = runs.cli("stop", run_id)
        finally:
            for pid in clients:
                os.kill(pid, signal.SIGKILL)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "0 processes left on 3 hosts" in r.stdout, r.stdout + r.stderr
        assert all_gone(hs) == {h.name: set() for h in hs.hosts}


@pytest.mark.launches
def test_a_detached_run_gives_the_ranks_the_users_pythonpath(tmp_path, runs):
    """submit -d starts its supervisor with mlaunch's own package root first on PYTHONPATH (so
    that it imports itself); local ranks inherited it and saw mlaunch's files first. They get
    the user's PYTHONPATH (here none, then one of theirs), as a foreground run gives them."""
    for theirs in (None, str(tmp_path / "mine")):
        if theirs is None:
            runs.env.pop("PYTHONPATH", None)
        else:
            runs.env["PYTHONPATH"] = theirs
        out = str(tmp_path / f"out-{theirs is None}")
        run_id = runs.detach(tmp_path, script_job(["localhost"], 1, "pythonpath_job.py", [], out),
                             name=f"pp-{theirs is None}.yaml")
        row = runs.wait_state(run_id, ("succeeded", "failed", "stopped", "lost"))
        assert row["state"] == "succeeded", row
        with open(runs.console_path(run_id)) as fh:
            got = re.findall(r"pythonpath (\S+)$", fh.read(), re.M)
        assert got == [theirs or "-"], got

"""A backend of a test's own (tests/toy_backend.py) through the one Backend interface: one
line in launcher.backends.TABLE, and a real 2-node `trainer: script` run goes through
plan -> dryrun -> run, registered, its nodes started by the toy's own transport."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import launcher.backends
from launcher.backends import backend_for
from launcher.backends.base import proc_start
from launcher.record.registry import Registry
from launcher.runs.attempts import SubmitOptions
from launcher.spec import validate

from . import toy_backend
from .helpers import ROOT, limit, script_job

# Each rank prints the node the toy started it as (its TOY_NODE and its working folder),
# then: FAIL_RANK -1: exits 0; else the failing rank waits until the other rank has said
# it is up (a file), and exits 3 while the other sleeps until torn down.
NODE_SCRIPT = """\
import os, sys, time
fail_rank, ready = int(sys.argv[1]), sys.argv[2]
rank = int(os.environ["RANK"])
print(f"toy-marker {os.environ.get('TOY_NODE')} cwd {os.getcwd()} rank {rank} pid {os.getpid()}",
      flush=True)
if fail_rank < 0:
    sys.exit(0)
if rank == fail_rank:
    deadline = time.monotonic() + float(sys.argv[3])
    while not os.path.exists(ready) and time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"rank {rank} exiting 3", flush=True)
    sys.exit(3)
open(ready, "w").close()
time.sleep(3600)
"""


@pytest.fixture
def toy(monkeypatch, tmp_path):
    """Backend "toy" registered, MLAUNCH_HOME in tmp_path; SIGTERM's handler put back after
    (Backend.run makes SIGTERM act as Ctrl-C in the process that runs it)."""
    monkeypatch.setitem(launcher.backends.TABLE, "toy", "tests.toy_backend:ToyBackend")
    monkeypatch.setenv("MLAUNCH_HOME", str(tmp_path / "home"))
    before = signal.getsignal(signal.SIGTERM)
    toy_backend.STARTED.clear()
    yield backend_for("toy")
    signal.signal(signal.SIGTERM, before)


def _job(tmp_path, fail_rank: int):
    return validate(_spec(tmp_path, fail_rank))


def _spec(tmp_path, fail_rank: int) -> dict:
    script = tmp_path / "node_script.py"
    script.write_text(NODE_SCRIPT)
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    spec = script_job(["localhost", "localhost"], 1, "fail_or_sleep.py",
                      [str(fail_rank), str(tmp_path / "ready"), "120"], str(tmp_path / "out"),
                      cuda_visible_devices=[[0], [1]], shared_dir=str(shared))
    spec["script"]["path"] = str(script)
    return spec


def _run(backend, job, tmp_path, run_id: str, preflight: bool) -> tuple[int, object]:
    plan = backend.plan(job, run_id=run_id, log_dir=str(tmp_path / "logs"))
    request = backend.dryrun(plan)
    assert request.backend == "toy" and request.plan is plan
    code = backend.run(request, SubmitOptions(run_id=run_id, preflight=preflight), job)
    return code, plan


def _alive(pid: int) -> bool:
    """pid is a process that has not ended (a zombie not yet reaped has ended)."""
    return proc_start(pid) is not None


def _marker(log: str) -> re.Match:
    m = re.search(r"toy-marker (\S+) cwd (\S+) rank (\d+) pid (\d+)", log)
    assert m, log
    return m


@pytest.mark.launches
def test_a_toy_backend_runs_a_registered_two_node_job(toy, tmp_path):
    job = _job(tmp_path, -1)
    code, plan = _run(toy, job, tmp_path, "toy-ok", preflight=True)
    assert code == 0

    # Each node ran through the toy's transport, under its own name, and only its own output
    # is in its log file.
    assert sorted((tag, rank) for tag, rank, _ in toy_backend.STARTED) == [("toy-ok", 0), ("toy-ok", 1)]
    for node in plan.nodes:
        log = open(node.log_path).read()
        m = _marker(log)
        assert (m.group(1), m.group(3)) == (f"node{node.rank}", str(node.rank)), log
        assert m.group(2) == toy_backend.node_folder(plan.run_dir, node.rank), log
        assert len(re.findall("toy-marker", log)) == 1, log

    reg = Registry(os.path.join(str(tmp_path / "home"), "runs.db"))
    try:
        run, attempts = reg.get("toy-ok"), reg.attempts("toy-ok")
    finally:
        reg.close()
    assert (run.backend, run.state, run.exit_code) == ("toy", "succeeded", 0), run
    assert [(a.n, a.tag, a.state, a.exit_code) for a in attempts] == [(0, "toy-ok", "succeeded", 0)]
    recorded = attempts[0].plan
    assert recorded["backend"] == "toy" and recorded["run_id"] == "toy-ok"
    assert [(n["rank"], n["log"]) for n in recorded["nodes"]] == [
        (n.rank, n.log_path) for n in plan.nodes]
    assert attempts[0].log_paths == [n.log_path for n in plan.nodes]
    assert run.plan == recorded   # the run's plan is its last attempt's


@pytest.mark.launches
def test_a_failing_toy_node_fails_the_run_and_the_other_is_torn_down(toy, tmp_path):
    """Node 1 exits 3 once node 0 is up; node 0 (which would sleep an hour) is torn down:
    its leader (the toy's shell, exec'd into torchrun) and its rank, by PID, are gone."""
    job = _job(tmp_path, 1)
    code, plan = _run(toy, job, tmp_path, "toy-fail", preflight=False)
    assert code == 3
    leaders = {rank: pid for tag, rank, pid in toy_backend.STARTED if tag == "toy-fail"}
    assert sorted(leaders) == [0, 1]
    rank0 = int(_marker(open(plan.nodes[0].log_path).read()).group(4))
    assert "rank 1 exiting 3" in open(plan.nodes[1].log_path).read()
    assert [pid for pid in (leaders[0], rank0) if _alive(pid)] == [], "node 0 was not torn down"

    reg = Registry(os.path.join(str(tmp_path / "home"), "runs.db"))
    try:
        run, attempts = reg.get("toy-fail"), reg.attempts("toy-fail")
    finally:
        reg.close()
    assert (run.backend, run.state, run.exit_code) == ("toy", "failed", 3), run
    assert [(a.n, a.state, a.exit_code) for a in attempts] == [(0, "failed", 3)]
    assert len(attempts[0].plan["nodes"]) == 2 and attempts[0].plan["backend"] == "toy"


# The foreground supervisor of a toy run, in a process of its own (as `mlaunch submit` is):
# backend "toy" registered there too. Args: SPEC_JSON RUN_ID LOG_DIR.
SUPERVISOR = """\
import json, sys
import launcher.backends
launcher.backends.TABLE["toy"] = "tests.toy_backend:ToyBackend"
from launcher.runs.attempts import SubmitOptions
from launcher.spec import validate
job = validate(json.load(open(sys.argv[1])))
toy = launcher.backends.backend_for("toy")
request = toy.dryrun(toy.plan(job, run_id=sys.argv[2], log_dir=sys.argv[3]))
sys.exit(toy.run(request, SubmitOptions(run_id=sys.argv[2], preflight=False), job))
"""


@pytest.mark.launches
def test_cancel_of_a_toy_run_ends_every_node_through_the_toys_own_transport(toy, tmp_path):
    """A toy run whose 2 nodes sleep, driven by a supervisor process of its own; the toy's
    cancel (what `mlaunch stop` calls) interrupts it and sweeps the recorded plan's hosts
    through transport_to: nothing is left, each node's leader and rank gone by PID."""
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(_spec(tmp_path, 9)))   # rank 9: nobody fails, both sleep
    log_dir = str(tmp_path / "logs")
    plan = toy.plan(validate(_spec(tmp_path, 9)), run_id="toy-stop", log_dir=log_dir)
    sup = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(spec_path), "toy-stop", log_dir],
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + limit(120)
        ranks = {}
        while len(ranks) < 2:
            assert sup.poll() is None and time.monotonic() < deadline, sup.poll()
            for node in plan.nodes:
                text = open(node.log_path).read() if os.path.exists(node.log_path) else ""
                if "toy-marker" in text:
                    ranks[node.rank] = int(_marker(text).group(4))
            time.sleep(0.1)
        reg = Registry(os.path.join(str(tmp_path / "home"), "runs.db"))
        try:
            run = reg.get("toy-stop")
        finally:
            reg.close()
        assert run.backend == "toy" and run.state == "running", run
        leaders = [int(open(n["pidfile"]).read().split()[0]) for n in run.plan["nodes"]]
        assert all(_alive(pid) for pid in leaders + list(ranks.values()))

        result = toy.cancel(run)
        assert result.clean and result.left == {"localhost": 0}, result
        assert sup.wait(timeout=limit(60)) == 130, sup.stdout.read()
        assert [pid for pid in leaders + list(ranks.values()) if _alive(pid)] == []
        reg = Registry(os.path.join(str(tmp_path / "home"), "runs.db"))
        try:
            assert reg.get("toy-stop").state == "stopped"
        finally:
            reg.close()
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()


if __name__ == "__main__":   # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))

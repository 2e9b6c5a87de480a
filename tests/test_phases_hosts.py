"""The phase timeline of a real restarted run on namespace hosts: a script job over gloo on 2
hosts and a spare; node 1's link is cut while the job holds at step 3; the spare takes its
place and the job trains again. Every phase of both attempts is recorded in events.jsonl,
in order, one after the other, consistent with the events around it, and in the registry;
`ps` and `report` show it."""
from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

from launcher.record import phases
from launcher.record.events import read_events
from launcher.record.registry import Registry

from .helpers import ROOT, limit, script_job, write_spec
from .test_fanout import wait_ready

pytestmark = [pytest.mark.multihost, pytest.mark.launches]

FRESH = ["connect", "preflight", "checkpoint", "stage", "start", "rendezvous", "first step"]


def when(events: list[dict], name: str, attempt: int) -> list[float]:
    """Seconds since the run's first phase mark of each `name` event of `attempt`."""
    origin = phases._t(next(e for e in events if e["event"] == "phase"))
    return [(phases._t(e) - origin).total_seconds() for e in events
            if e["event"] == name and e["attempt"] == attempt]


def test_restart_with_a_spare_records_every_phase_in_order(make_hostset, tmp_path):
    home = str(tmp_path / "home")
    env = {**os.environ, "MLAUNCH_HOME": home}
    env.pop("MLAUNCH_DEBUG", None)
    with make_hostset(3) as hs:
        a, b, spare = hs.hosts
        out = str(tmp_path / "out")
        job = script_job([a.ip, b.ip], 1, "phase_job.py", ["3", "6"], out, hs=hs, hangup_after_s=6,
                         spare_hosts=[spare.ip]) | {"max_restarts": 1, "name": "phases"}
        proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", write_spec(tmp_path, job)],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert len(wait_ready(proc, 2, deadline_s=240)) == 2
        b.link_down()
        rest = proc.communicate(timeout=limit(240))[0]
    assert proc.returncode == 0, rest[-4000:]
    assert f"host replaced: node1 {b.ip} -> spare {spare.ip}" in rest, rest[-4000:]
    # the failed node is replaced: no restart back-off (restart_backoff_s is its default 5)
    assert "node failure: restart 1/1 now, without the failed node" in rest, rest[-4000:]

    (path,) = glob.glob(f"{out}/logs/*/events.jsonl")
    events = read_events(path)
    got = phases.timeline(events)
    names = {n: [p.name for p in phases.of_attempt(got, n)] for n in (0, 1)}
    assert names[0] == FRESH + ["training", "teardown", "settle"], names
    assert names[1] == ["backoff", "decide"] + FRESH[2:] + ["catch-up", "training"], names
    for x, y in zip(got, got[1:]):   # one after the other: no gap, no overlap
        assert x.start_s + x.seconds == pytest.approx(y.start_s, abs=1e-6)
    assert not got[-1].open

    def phase(n: int, name: str) -> phases.Phase:
        return next(p for p in phases.of_attempt(got, n) if p.name == name)

    def inside(t: float, p: phases.Phase) -> bool:
        return p.start_s - 1e-3 <= t <= p.start_s + p.seconds + 1e-3

    for n in (0, 1):
        assert all(inside(t, phase(n, "start")) for t in when(events, "node_start", n)), n
        (first,) = when(events, "first_step", n)
        assert first == pytest.approx(phase(n, "first step").start_s + phase(n, "first step").seconds, abs=2e-3)
    # the failure seen, then the teardown, then the nodes' reports
    lost = [t for t, e in zip(when(events, "node_exit", 0), [e for e in events if e["event"] == "node_exit"
                                                                 and e["attempt"] == 0]) if e.get("lost")]
    assert lost and lost[0] <= phase(0, "teardown").start_s + 1e-3
    (torn,) = when(events, "teardown", 0)
    assert torn == pytest.approx(phase(0, "settle").start_s, abs=2e-3)
    (replaced,) = when(events, "host_replaced", 1)
    assert inside(replaced, phase(1, "decide"))
    (restart,) = when(events, "restart", 1)
    assert inside(restart, phase(1, "checkpoint"))
    # catch-up: from the restart's step 1 back to step 3, where the fault found the job
    marks = [e for e in events if e["event"] == "phase" and e["attempt"] == 1]
    assert [(e.get("done"), e.get("step"), e.get("reached")) for e in marks if e.get("done")] == \
        [("rendezvous", None, None), ("first step", 1, 3), ("catch-up", 3, None)]
    assert next(e for e in marks if e["phase"] == "backoff")["reached"] == 3
    assert set(phases.back_to_training_s(got)) == {1}
    assert phases.first_step_s(got) == pytest.approx(phase(0, "first step").start_s + phase(0, "first step").seconds)

    # the registry holds each attempt's phases
    reg = Registry(os.path.join(home, "runs.db"))
    try:
        run = reg.runs()[0]
        stored = {a.n: [p[0] for p in a.phases] for a in reg.attempts(run.id)}
    finally:
        reg.close()
    assert stored == names

    # ps of an ended run names no phase going on; report draws and lists the phases
    r = subprocess.run([sys.executable, "-m", "launcher.cli", "ps", run.id], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=limit(60))
    assert r.returncode == 0 and "phase:" not in r.stdout, r.stdout + r.stderr
    pytest.importorskip("matplotlib")
    r = subprocess.run([sys.executable, "-m", "launcher.cli", "report", run.id, "--out", str(tmp_path / "rep")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit(120))
    assert r.returncode == 0, r.stderr
    md = open(tmp_path / "rep" / "report.md").read()
    assert "## Where the time went" in md and "| 1 | catch-up |" in md
    assert "- attempt 1: from the failure seen to training again:" in md
    assert os.path.getsize(tmp_path / "rep" / "report.png") > 0

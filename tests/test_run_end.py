"""Issue 50: every end of a run writes one `run_end` event (code, reason, attempts) and the
registry keeps the same reason (`ps RUN` shows it); below cluster.min_nodes the run ends with
the one min_nodes line naming every lost node, whichever path finds it.

The attempt loop is driven here with fakes (run_job, the executor, output_dir's master); the
reconnect with tests/test_spares.py's FakeExecutor; one test ends a real run on three
namespace hosts with two links cut."""
from __future__ import annotations

from types import SimpleNamespace

import glob
import os
import re

import pytest

from launcher.errors import UserError
from launcher.transport.base import Exit
from launcher.watch.health import Verdict
from launcher.session.outcome import JobResult, NodeOutcome
from launcher.runs import attempts, spares
from launcher.runs.attempts import SubmitOptions
from launcher.plan.launch_plan import build_plan
from launcher.record.events import read_events
from launcher.spec import validate

from .helpers import TRANSPORT, limit, mlaunch, script_job, write_spec
from .test_shrink import lora
from .test_spares import Events, FakeExecutor, Said


def job3(tmp_path, **top):
    """A script job on 3 hosts (never connected: run_job is a fake), logs under tmp_path."""
    return validate({"name": "t", "trainer": "script", "script": {"path": "/abs/train.py"},
                     "output_dir": str(tmp_path / "out"),
                     "cluster": {"hosts": ["a", "b", "c"], "gpus_per_node": 1}} | top)


class Rec:
    """A recorder that keeps what submit tells it."""

    def __init__(self):
        self.reasons, self.ended = [], []

    def attempt_started(self, *a, **kw):
        pass

    def planned(self, data):
        pass

    def attempt_ended(self, *a):
        pass

    def restarting(self):
        pass

    def changed_output(self):
        self.changed = True

    def ended_because(self, reason):
        self.reasons.append(reason)


class Master:
    """output_dir's helper: no checkpoint anywhere."""

    executor = plan = last = None
    ignore = ()

    def discover(self):
        return None

    def set_aside(self, tag, resume_from):
        return {"moved": [], "to": None}


def failed(code: int, rank: int = 1) -> JobResult:
    nodes = [NodeOutcome(r, h, Exit(code) if r == rank else Exit(143), terminated=r != rank)
             for r, h in enumerate("abc")]
    return JobResult(code, nodes, first_failure=rank)


def ok() -> JobResult:
    return JobResult(0, [NodeOutcome(r, h, Exit(0)) for r, h in enumerate("abc")])


class FakeBackend:
    """The attempt loop's hooks (launcher/backends/base.py): each attempt's result from a
    list, and the restart (next_attempt) the test gives."""

    name = "ssh"

    def __init__(self, results, restart=None):
        self.feed, self.restart = iter(results), restart

    def run_attempt(self, plan, executor, printer, on_started):
        return next(self.feed)

    def next_attempt(self, job, plan, executor, result, printer, events):
        return self.restart(job, plan, executor, result, printer, events)


def fails_once(seen: list, before=None) -> SimpleNamespace:
    """A backend whose first attempt fails (exit 1 on node 0) and whose later ones succeed, each
    on the same hosts again; seen gets each attempt's plan (before(plan), when given, runs
    first: what the attempt leaves behind)."""
    def run_job(plan, *a):
        seen.append(before(plan) if before else plan)
        code = 1 if len(seen) == 1 else 0
        return JobResult(code, [NodeOutcome(r, n.host, Exit(code)) for r, n in enumerate(plan.nodes)],
                         first_failure=0 if code else None)
    return SimpleNamespace(name="ssh", run_attempt=run_job, next_attempt=lambda job, plan, ex, *a: (job, plan, ex))


def run(tmp_path, monkeypatch, job, results, restart=None):
    """_attempts over fake attempts (results, in turn); restart replaces next_attempt.
    Returns (exit code or the exception raised, the run's events, the recorder)."""
    plan = build_plan(job, run_id="r", log_dir=str(tmp_path / "logs"))
    rec = Rec()
    try:
        got = attempts._attempts(plan, None, Said(), SubmitOptions(log_dir=str(tmp_path / "logs")),
                                 Master(), None, rec, FakeBackend(results, restart))
    except BaseException as e:   # noqa: BLE001 - the test looks at which
        got = e
    return got, read_events(os.path.join(plan.log_dir, "events.jsonl")), rec


def the_end(events) -> dict:
    """The one run_end event, last."""
    ends = [e for e in events if e["event"] == "run_end"]
    assert len(ends) == 1 and events[-1] is ends[0], events
    return {k: ends[0][k] for k in ("code", "reason", "attempts")}


def test_success_and_failure_each_end_with_one_run_end(tmp_path, monkeypatch):
    code, events, rec = run(tmp_path / "1", monkeypatch, job3(tmp_path), [ok()])
    assert code == 0
    assert the_end(events) == {"code": 0, "reason": "attempt 0 succeeded: every node exited 0",
                               "attempts": 1}
    assert rec.reasons == ["attempt 0 succeeded: every node exited 0"]
    code, events, rec = run(tmp_path / "2", monkeypatch, job3(tmp_path), [failed(3)])
    why = "attempt 0 failed (node1 b: exit 3); no restart left (max_restarts 0)"
    assert code == 3 and the_end(events) == {"code": 3, "reason": why, "attempts": 1}
    assert rec.reasons == [why]


def test_restart_limit_nan_and_interrupt_say_why(tmp_path, monkeypatch):
    again = lambda job, plan, ex, *a: (job, plan, ex)  # noqa: E731 - a restart that reconnects at once
    job = job3(tmp_path, max_restarts=1, restart_backoff_s=0)
    code, events, _ = run(tmp_path / "1", monkeypatch, job, [failed(3), failed(4, rank=2)], again)
    assert code == 4 and the_end(events) == {
        "code": 4, "reason": "attempt 1 failed (node2 c: exit 4); no restart left (max_restarts 1)",
        "attempts": 2}
    assert [e["event"] for e in events].count("restart") == 1
    nan = failed(1)
    nan.health = Verdict("nan", {}, stop=True, message="loss is nan at step 7")
    code, events, _ = run(tmp_path / "2", monkeypatch, job, [nan], again)
    assert the_end(events)["reason"] == ("attempt 0 failed (loss is nan at step 7); not "
                                         "restarted: a restart would end the same way")
    stopped = failed(130)
    stopped.interrupted = True
    code, events, _ = run(tmp_path / "3", monkeypatch, job, [stopped], again)
    assert code == 130 and the_end(events) == {
        "code": 130, "reason": "attempt 0 interrupted (Ctrl-C or mlaunch stop)", "attempts": 1}


def test_the_step_reached_is_never_lowered_by_an_attempt_that_got_less_far(tmp_path, monkeypatch):
    """Attempt 0 reaches step 50 and fails; attempt 1 fails before its first step, attempt 2
    at step 45 (in its catch-up): each restart's catch-up still ends at step 50 (the backoff
    marks' `reached`, which the next attempt's Watch reads)."""
    again = lambda job, plan, ex, *a: (job, plan, ex)  # noqa: E731
    job = job3(tmp_path, max_restarts=3, restart_backoff_s=0)
    results = [failed(1), failed(1), failed(1), ok()]
    for r, step in zip(results, (50, None, 45)):
        r.last_step = step
    code, events, _ = run(tmp_path / "1", monkeypatch, job, results, again)
    assert code == 0
    assert [(e["attempt"], e.get("reached")) for e in events if e.get("phase") == "backoff"] == [
        (1, 50), (2, 50), (3, 50)]


@pytest.mark.parametrize("raised, code, reason", [
    (UserError("cluster.min_nodes: 2: lost node1 b (connection lost); node2 c (unreachable: "
               "connection timed out), which leaves 1 node(s) and no spare host; the run ends"), 2,
     "cluster.min_nodes: 2: lost node1 b (connection lost); node2 c (unreachable: connection "
     "timed out), which leaves 1 node(s) and no spare host; the run ends"),
    (UserError(["host c: connection timed out"], header="cannot reach every host and no spare "
               "host is left; nothing was started anywhere:"), 2,
     "cannot reach every host and no spare host is left; nothing was started anywhere: host c: "
     "connection timed out"),
    (KeyboardInterrupt(), 130, "interrupted (Ctrl-C) before attempt 1 started"),
    (RuntimeError("boom"), 1, "mlaunch failed: RuntimeError: boom"),
])
def test_an_end_during_a_restart_writes_run_end_and_raises(tmp_path, monkeypatch, raised, code, reason):
    """A restart refused (reconnect, min_nodes), Ctrl-C in the back-off, or a bug: the
    exception still reaches the CLI (its lines, its exit code) after run_end said why."""
    def restart(*a):
        raise raised
    job = job3(tmp_path, max_restarts=2, restart_backoff_s=0)
    got, events, rec = run(tmp_path, monkeypatch, job, [failed(255)], restart)
    assert got is raised
    assert the_end(events) == {"code": code, "reason": reason, "attempts": 1}
    assert events[-1]["attempt"] == 1 and rec.reasons == [reason]


def test_conversion_refused_before_attempt_0_writes_run_end(tmp_path, monkeypatch):
    """A failure before the first attempt starts (here the resume's conversion) ends with
    run_end too, with no attempt counted."""
    def refuse(*a, **kw):
        raise UserError("resume from /o/checkpoint-3 at world 3: DeepSpeed's universal checkpoint "
                        "could not be made on node0 a: x; the run ends (the checkpoint itself is "
                        "untouched)")
    monkeypatch.setattr(attempts.universal_ckpt, "prepare", refuse)
    got, events, _ = run(tmp_path, monkeypatch, job3(tmp_path), [])
    assert isinstance(got, UserError)
    assert the_end(events)["attempts"] == 0 and the_end(events)["code"] == 2
    assert [e["event"] for e in events] == ["run_start", "run_end"]


def lost(*ranks: int, hosts="n0 n1 n2".split(), terminated=()) -> JobResult:
    nodes = [NodeOutcome(r, h, Exit(255, lost=True, detail="connection lost") if r in ranks + terminated
                         else Exit(143), terminated=r not in ranks) for r, h in enumerate(hosts)]
    return JobResult(255, nodes, first_failure=ranks[0])


@pytest.fixture
def reach(monkeypatch):
    """spares.reconnect against hosts that answer but for those in the returned set."""
    down = set()
    monkeypatch.setattr(TRANSPORT, "fn",
                        lambda plan: FakeExecutor([n.login for n in plan.nodes], down))
    monkeypatch.setattr(spares, "unfit_hosts", lambda plan, executor: {})
    return down


def reconnect_error(job, result) -> list[str]:
    plan = build_plan(job, run_id="r")
    with pytest.raises(UserError) as err:
        spares.reconnect(job, plan, result, Said(), Events(), lambda j: build_plan(j, run_id="r"), TRANSPORT)
    return err.value.lines()


def test_below_min_nodes_names_every_lost_node_whichever_path_finds_it(reach):
    """Both lost in the attempt; one lost and one torn down that is unreachable now (a frozen
    node read as a plain exit); none lost and both unreachable: the same one line, every lost
    node by its rank in the attempt that ran."""
    job = validate(lora(per_device=1, grad_accum=2, min_nodes=2))
    line = ("cluster.min_nodes: 2: lost node1 n1 ({a}); node2 n2 ({b}), which leaves 1 node(s) "
            "and no spare host; the run ends")
    gone, down = "connection lost", "unreachable: connection timed out"
    assert reconnect_error(job, lost(1, 2)) == [line.format(a=gone, b=gone)]
    reach.add("n2")
    assert reconnect_error(job, lost(1, terminated=(2,))) == [line.format(a=gone, b=down)]
    reach.add("n1")
    assert reconnect_error(job, JobResult(1, [])) == [line.format(a=down, b=down)]


def test_below_min_nodes_after_an_earlier_drop_names_all_three(reach):
    """4 nodes, min_nodes 2: node 1 lost (dropped: 3 left), then nodes 2 and 3 unreachable:
    the line names all three, and the shrink that happened first was said."""
    job = validate(lora(hosts=4, gpus=1, per_device=1, grad_accum=3, min_nodes=2))
    reach.update({"n2", "n3"})
    plan = build_plan(job, run_id="r")
    said = Said()
    with pytest.raises(UserError) as err:
        spares.reconnect(job, plan, lost(1, hosts=["n0", "n1", "n2", "n3"]), said, Events(),
                         lambda j: build_plan(j, run_id="r"), TRANSPORT)
    assert err.value.lines() == [
        "cluster.min_nodes: 2: lost node1 n1 (connection lost); node2 n2 (unreachable: "
        "connection timed out); node3 n3 (unreachable: connection timed out), which leaves 1 "
        "node(s) and no spare host; the run ends"]
    assert said.lines[0].startswith("shrink: lost node1 n1 (connection lost); the next attempt "
                                    "runs on 3 nodes"), said.lines


def test_health_check_at_min_nodes_says_min_nodes_and_no_min_nodes_stays_generic(monkeypatch):
    """A host failing its check with nothing to replace it and min_nodes reached: the min_nodes
    line; without min_nodes the old refusals stand."""
    monkeypatch.setattr(TRANSPORT, "fn",
                        lambda plan: FakeExecutor([n.login for n in plan.nodes], set()))
    monkeypatch.setattr(spares, "unfit_hosts",
                        lambda plan, ex: {1: "health check: gpu: no GPU"} if len(plan.nodes) > 1 else {})
    job = validate(lora(hosts=2, per_device=1, grad_accum=2, min_nodes=2))
    assert reconnect_error(job, JobResult(1, [])) == [
        "cluster.min_nodes: 2: lost node1 n1 (health check: gpu: no GPU), which leaves 1 node(s) "
        "and no spare host; the run ends"]
    job = validate(lora(hosts=2, per_device=1, grad_accum=2))
    assert reconnect_error(job, JobResult(1, []))[0].startswith(
        "a host of the next attempt fails its health check and no spare host is left")


def test_a_refused_submit_says_why_and_is_no_run(tmp_path):
    """A submit refused after it opened the run's record (here: a host no name service knows,
    found when it connects): the terminal says why; the registry keeps no run (issue 56), so
    `ps` never lists it and neither its id nor its job name finds it."""
    spec = write_spec(tmp_path, {"name": "t-refused", "trainer": "script", "script": {"path": "/abs/x.py"},
                                 "cluster": {"hosts": ["nohost.invalid"], "gpus_per_node": 1},
                                 "output_dir": str(tmp_path / "out")})
    r = mlaunch("submit", spec, "--no-preflight", "--run-id", "end-refused")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "mlaunch: cannot reach every host; nothing was started anywhere:" in r.stderr.splitlines(), r.stderr
    assert "host nohost.invalid: ssh: Could not resolve hostname" in r.stderr
    for ref in ("end-refused", "t-refused"):
        ps = mlaunch("ps", ref)
        assert ps.returncode == 2 and "no run with this id prefix or job name" in ps.stderr, ps.stderr
    assert "end-refused" not in mlaunch("ps", "--all").stdout
    assert not os.path.exists(os.path.join(os.environ["MLAUNCH_HOME"], "runs", "end-refused"))


def test_registry_opened_before_the_reason_column_gets_it(tmp_path):
    """A runs.db from before `reason`: opened, it gains the column; old rows read None."""
    import sqlite3
    from launcher.record.registry import Registry
    path = str(tmp_path / "runs.db")
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE runs (id TEXT PRIMARY KEY, name TEXT NOT NULL, backend TEXT NOT NULL, hosts TEXT NOT NULL,"
        " spec TEXT NOT NULL, state TEXT NOT NULL, handle TEXT NOT NULL DEFAULT '{}', supervisor_pid INTEGER,"
        " supervisor_start INTEGER, detached INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0,"
        " exit_code INTEGER, log_dir TEXT, output_dir TEXT, resumed_from TEXT, stop_requested INTEGER NOT NULL"
        " DEFAULT 0, created REAL NOT NULL, started REAL, ended REAL);"
        "CREATE TABLE attempts (run_id TEXT NOT NULL, n INTEGER NOT NULL, tag TEXT NOT NULL, state TEXT NOT NULL,"
        " exit_code INTEGER, resumed_from TEXT, log_paths TEXT NOT NULL, started REAL, ended REAL,"
        " PRIMARY KEY (run_id, n));"
        "INSERT INTO runs (id, name, backend, hosts, spec, state, created) VALUES"
        " ('old', 't', 'ssh', '[]', '{}', 'failed', 1.0);")
    old.close()
    reg = Registry(path)
    assert reg.get("old").reason is None
    reg.create("new", name="t", backend="ssh", hosts=[], spec={}, detached=False,
               supervisor=(1, None), log_dir=None, output_dir=None)
    assert reg.set_state("new", "failed", exit_code=2, reason="why")
    assert (reg.get("new").reason, [r.reason for r in reg.runs()]) == ("why", ["why", None])
    reg.close()


def test_min_nodes_end_on_namespace_hosts(make_hostset, tmp_path):
    """3 nodes, no spare, min_nodes 2, max_restarts 1: nodes 1 and 2 lose their links mid-run.
    Exit 2, the one min_nodes line naming both, run_end with that reason, `ps RUN` says it."""
    from .test_fanout import start, wait_ready
    with make_hostset(3) as hs:
        a, b, c = hs.hosts
        out = str(tmp_path / "out")
        os.makedirs(out)
        job = script_job([a.ip, b.ip, c.ip], 1, "spare_job.py", [out], out, hs=hs,
                         hangup_after_s=6, min_nodes=2) | {"max_restarts": 1, "restart_backoff_s": 0}
        proc = start(tmp_path, job)
        assert len(wait_ready(proc, 3, deadline_s=240)) == 3
        b.link_down()
        c.link_down()
        rest = proc.communicate(timeout=limit(240))[0]
        assert proc.returncode == 2, rest[-4000:]
        (line,) = [ln for ln in rest.splitlines() if "cluster.min_nodes: 2: lost " in ln]
        m = re.fullmatch(rf"mlaunch: cluster.min_nodes: 2: lost node1 {re.escape(b.ip)} \(.+\); "
                         rf"node2 {re.escape(c.ip)} \(.+\), which leaves 1 node\(s\) and no "
                         "spare host; the run ends", line)
        assert m, rest[-4000:]
        assert "Traceback" not in rest and "nothing was started anywhere" not in rest, rest[-4000:]
        (path,) = glob.glob(f"{out}/logs/*/events.jsonl")
        events = read_events(path)
        end = the_end(events)
        assert end == {"code": 2, "reason": line.removeprefix("mlaunch: "), "attempts": 1}, end
        run_id = events[0]["run_id"]
        ps = mlaunch("ps", run_id)
        assert f"ended: {end['reason']}" in ps.stdout.splitlines(), ps.stdout
        print(f"min_nodes end: {line}")

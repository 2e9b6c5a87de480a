"""The phase timeline (launcher/record/phases.py) from recorded events: its phases and their
order, the trainers' start-up lines that close them (recorded output in tests/data/), the
current phase and the slow-phase warning of `mlaunch ps RUN`, and the report's bars."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

from launcher.backends.base import proc_start
from launcher.record import phases
from launcher.record.registry import Registry
from launcher.view import timeline
from launcher.watch.milestones import MARKS, Milestones

from .helpers import ROOT
from .runs import Runs

T0 = datetime(2026, 12, 5, 12, 0, 0, tzinfo=timezone.utc)


def at(s: float) -> str:
    t = T0 + timedelta(seconds=s)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def ev(s: float, event: str, attempt: int = 0, **fields) -> dict:
    return {"time": at(s), "run_id": "r", "attempt": attempt, "event": event, **fields}


def ph(s: float, name: str, attempt: int = 0, **fields) -> dict:
    return ev(s, "phase", attempt, phase=name, **fields)


# A restarted run as the launcher writes it: a start, a failure at 20 s, a spare in, a resume.
RESTARTED = [
    ph(0, "connect"), ph(0.5, "preflight"), ph(1.5, "checkpoint"), ev(1.7, "run_start"),
    ph(1.7, "stage"), ph(1.8, "start"), ev(2.0, "node_start", node=0), ph(2.2, "rendezvous"),
    ph(5.2, "loading", done="rendezvous"), ph(7.0, "loading", done="data"),
    ph(8.0, "loading", done="model"), ph(8.5, "first step", done="trainer setup"),
    ph(10.0, "training", done="first step", step=1), ev(10.0, "first_step", step=1),
    ev(19.9, "node_exit", node=1, lost=True), ph(20.0, "teardown"), ev(21.0, "teardown"),
    ph(21.0, "settle"),
    ph(22.0, "backoff", 1, reached=8, cause="node1: connection lost"), ph(22.0, "decide", 1),
    ev(23.0, "host_replaced", 1), ph(24.0, "checkpoint", 1), ev(24.5, "restart", 1),
    ph(24.5, "stage", 1), ph(24.6, "start", 1), ph(25.0, "rendezvous", 1),
    ph(27.0, "loading", 1, done="rendezvous"),
    ph(30.0, "catch-up", 1, done="first step", step=6, reached=8),
    ph(33.0, "training", 1, done="catch-up", step=8), ev(40.0, "run_end", 1, code=0),
]


def test_timeline_names_orders_and_times_every_phase_of_a_restarted_run():
    got = phases.timeline(RESTARTED)
    assert [(p.attempt, p.name) for p in got] == [
        (0, "connect"), (0, "preflight"), (0, "checkpoint"), (0, "stage"), (0, "start"),
        (0, "rendezvous"), (0, "data"), (0, "model"), (0, "trainer setup"), (0, "first step"),
        (0, "training"), (0, "teardown"), (0, "settle"),
        (1, "backoff"), (1, "decide"), (1, "checkpoint"), (1, "stage"), (1, "start"),
        (1, "rendezvous"), (1, "first step"), (1, "catch-up"), (1, "training")]
    assert [round(p.seconds, 3) for p in got][:6] == [0.5, 1.0, 0.2, 0.1, 0.4, 3.0]
    # one after the other, no gap, no overlap, from the first mark to run_end
    for a, b in zip(got, got[1:]):
        assert a.start_s + a.seconds == pytest.approx(b.start_s)
    assert got[-1].start_s + got[-1].seconds == pytest.approx(40.0) and not got[-1].open
    assert phases.first_step_s(got) == 10.0
    assert phases.back_to_training_s(got) == {1: 13.0}   # teardown began 20.0, caught up 33.0
    assert phases.reached_before(RESTARTED, 1) == 8
    assert phases.stored(phases.of_attempt(got, 1))[0] == ["backoff", 22.0, 0.0]


def test_current_phase_is_the_last_one_begun_while_the_run_goes_on():
    going = RESTARTED[:8]   # up to the rendezvous mark
    now = T0 + timedelta(seconds=43.2)
    cur = phases.current(going, now)
    assert (cur.name, round(cur.seconds, 1), cur.open) == ("rendezvous", 41.0, True)
    assert phases.current(RESTARTED, now) is None   # ended: run_end
    assert timeline.ps_lines(going, now) == ["phase: rendezvous 41 s (attempt 0)"]


def test_slow_phase_warned_once_naming_both_figures():
    before = [("preflight", 8.0), ("start", 1.0), ("rendezvous", 4.0), ("rendezvous", 3.0)]
    now = [("preflight", 12.0), ("start", 8.0), ("rendezvous", 41.0), ("rendezvous", 50.0),
           ("first step", 30.0)]
    assert phases.slow_lines(now, before, "job-1") == [
        "warning: rendezvous took 41 s, 4.0 s in the job's previous run job-1 (more than 2×)"]
    assert phases.slow_lines(now, [], "job-1") == []


def strip_prefix(line: str) -> str:
    return re.sub(r"^\[node\d+ \S+ local\d+\] ", "", line.rstrip("\n"))


@pytest.mark.parametrize("log, want", [
    ("lf-quickstart-run.log", ["rendezvous", "data", "model", "trainer setup"]),
    ("swift-run.log", ["rendezvous", "model", "data"]),   # its Trainer logs no "Running training"
])
def test_recorded_trainer_output_closes_the_start_up_stages_in_its_order(log, want):
    lines = [strip_prefix(ln) for ln in open(os.path.join(ROOT, "tests", "data", log), encoding="utf-8")]
    seen = []
    m = Milestones(lambda **f: seen.append(f))
    for i in range(0, len(lines), 7):   # in chunks, as the relay hands them over
        m.lines(lines[i:i + 7])
    assert [f["done"] for f in seen] == want
    assert all(f["phase"] == "loading" for f in seen)
    m.step(1, first=True)
    assert seen[-1] == {"phase": "training", "done": "first step", "step": 1, "reached": None}
    m.lines(["training example:"])   # an eval's dataset after the first step: not start-up
    assert len(seen) == len(want) + 1


def test_a_restart_behind_the_step_reached_catches_up_then_trains():
    seen = []
    m = Milestones(lambda **f: seen.append(f), reached=8)
    m.step(6, first=True)
    m.step(7, first=False)
    m.step(9, first=False)
    m.step(10, first=False)
    assert seen == [{"phase": "catch-up", "done": "first step", "step": 6, "reached": 8},
                    {"phase": "training", "done": "catch-up", "step": 9}]


def test_the_relay_copies_the_start_up_lines():
    from launcher.spec import validate
    from launcher.transport.relay import relay_config
    from .helpers import plan_of, script_job
    config = relay_config(plan_of(validate(script_job(["localhost"], 1, "steps.py", ["1", "0"], "/tmp/x"))))
    assert set(MARKS) <= set(config["marks"])


def test_report_draws_a_bar_per_phase_per_attempt(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    got = phases.timeline(RESTARTED)
    data = [{"run_id": "r", "phases": timeline.series(got)}]
    fig, ax = plt.subplots()
    timeline.draw(ax, data)
    bars = [p for p in ax.patches]
    assert len(bars) == len(got)
    # each attempt's phases one after the other from the attempt's own start; a training bar
    # drawn at most a quarter of the longest attempt's other phases (at least 5 s) long
    cap = max(5.0, 0.25 * max(sum(p.seconds for p in phases.of_attempt(got, a) if p.name not in timeline.LONG)
                               for a in (0, 1)))
    want = []
    for a in (0, 1):
        x = 0.0
        for p in phases.of_attempt(got, a):
            w = min(p.seconds, cap) if p.name in timeline.LONG else p.seconds
            want.append((round(x, 3), round(max(w, 0.05), 3)))
            x += w
    assert [(round(b.get_x(), 3), round(b.get_width(), 3)) for b in bars] == want
    assert [t.get_text() for t in ax.get_yticklabels()] == ["attempt 0", "attempt 1"]
    assert "first step 10.0 s after submit" in ax.get_title()
    assert "attempt 1 training again 13.0 s after the failure" in ax.get_title()
    plt.close(fig)
    md = "\n".join(timeline.markdown(got))
    assert "- submit to the first step: 10.0 s" in md
    assert "| 1 | catch-up | 30.0 | 3.0 |" in md


def test_a_long_run_still_shows_its_start_up_and_its_training_length():
    """Three hours of training after a 10 s start: the start-up phases keep their bars (they
    were slivers on an axis of 10,800 s), training is drawn short and says its length."""
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    got = [phases.Phase(0, n, st, s) for n, st, s in (("connect", 0.0, 1.0), ("preflight", 1.0, 2.0),
                                                     ("rendezvous", 3.0, 6.0), ("first step", 9.0, 1.0),
                                                     ("training", 10.0, 10800.0))]
    md = "\n".join(timeline.markdown(got))
    assert "| 0 | rendezvous | 3.0 | 6.0 | " + "█" * 16 + " |" in md, md   # 40 cells for 15 s drawn
    assert "| 0 | training | 10.0 | 10800.0 | " + "█" * 13 + "» |" in md, md
    fig, ax = plt.subplots()
    timeline.draw(ax, [{"run_id": "r", "phases": timeline.series(got)}])
    widths = [round(b.get_width(), 3) for b in ax.patches]
    assert widths == [1.0, 2.0, 6.0, 1.0, 5.0]
    assert "training\n10800.0 s" in [t.get_text() for t in ax.texts]
    plt.close(fig)


def write_events(log_dir: str, events: list[dict]) -> None:
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, "events.jsonl"), "w") as fh:
        fh.writelines(json.dumps(e) + "\n" for e in events)


def test_ps_names_the_phase_going_on_and_warns_of_one_far_slower_than_last_run(tmp_path):
    """Recorded events, no timing: the job's previous run (its attempt phases in the
    registry) had a 4 s rendezvous; this run's rendezvous began 41 s ago, its stage took 30 s
    (2 s before) and its start 8 s (1 s before: under 10 s, no warning)."""
    runs = Runs(str(tmp_path / "home"))
    reg = Registry(os.path.join(runs.home, "runs.db"))
    old, new = "job-20261205-110000-aaaa", "job-20261205-120000-bbbb"
    reg.create(old, name="job", backend="ssh", hosts=["h"], spec={}, detached=True,
               supervisor=(0, None), log_dir=str(tmp_path / "old"), output_dir=None)
    reg.attempt_started(old, 0, old, [], None)
    reg.set_phases(old, 0, [["stage", 0.0, 2.0], ["start", 2.0, 1.0], ["rendezvous", 3.0, 4.0]])
    reg.set_state(old, "succeeded", exit_code=0)
    time.sleep(0.01)   # created after it
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", new])
    try:
        reg.create(new, name="job", backend="ssh", hosts=["h"], spec={}, detached=True,
                   supervisor=(sleeper.pid, proc_start(sleeper.pid)), log_dir=str(tmp_path / "new"),
                   output_dir=None)
        reg.attempt_started(new, 0, new, [], None)
        now = datetime.now(timezone.utc)
        t = lambda s: (now - timedelta(seconds=s)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"  # noqa: E731
        write_events(str(tmp_path / "new"), [
            {"time": t(79), "run_id": new, "attempt": 0, "event": "phase", "phase": "stage"},
            {"time": t(49), "run_id": new, "attempt": 0, "event": "phase", "phase": "start"},
            {"time": t(41), "run_id": new, "attempt": 0, "event": "phase", "phase": "rendezvous"}])
        r = runs.cli("ps", new)
        js = runs.cli("ps", new, "--json")
    finally:
        sleeper.kill()
        sleeper.wait()
        reg.close()
    assert r.returncode == 0, r.stderr
    found = re.search(r"^phase: rendezvous (\d+) s \(attempt 0\)$", r.stdout, re.M)
    assert found and int(found.group(1)) >= 41, r.stdout
    warnings = [ln for ln in r.stdout.splitlines() if ln.startswith("warning:")]
    assert warnings[0] == f"warning: stage took 30 s, 2.0 s in the job's previous run {old} (more than 2×)"
    assert re.fullmatch(rf"warning: rendezvous took \d+ s, 4\.0 s in the job's previous run {old} "
                        r"\(more than 2×\)", warnings[1]), warnings
    assert len(warnings) == 2, r.stdout
    lines = json.loads(js.stdout)["phase_lines"]   # a moment later: the open phase has grown
    assert lines[0].startswith("phase: rendezvous ") and lines[1] == warnings[0] and len(lines) == 3


def test_training_is_never_held_against_the_previous_runs_and_a_failed_catch_up_is_not_back():
    """A run that trains for 600 s after one that was stopped after 30 s: no warning (training,
    catch-up and the nodes' settling are the job's length, not the launcher's). An attempt that
    fails again during its catch-up never was back at training: no figure for it."""
    assert phases.slow_lines([("training", 600.0), ("catch-up", 90.0), ("settle", 40.0)],
                             [("training", 30.0), ("catch-up", 3.0), ("settle", 1.0)], "prev") == []
    failed_again = RESTARTED[:-2] + [ph(31.0, "teardown", 1), ph(32.0, "settle", 1), ev(33.0, "run_end", 1, code=1)]
    assert phases.back_to_training_s(phases.timeline(failed_again)) == {}
    assert phases.back_to_training_s(phases.timeline(RESTARTED)) == {1: 13.0}


def test_a_damaged_event_line_is_skipped_not_a_crash():
    """A hand-edited line without a time zone and one whose attempt is null: the timeline is
    the other lines' (`mlaunch report` died on both with a traceback)."""
    damaged = [dict(RESTARTED[0], time="2026-12-05T12:00:00.200"), dict(RESTARTED[1], attempt=None)] + RESTARTED[2:]
    got = phases.timeline(damaged)
    assert [p.name for p in got][:2] == ["preflight", "checkpoint"] and got[0].attempt == 0


def test_the_previous_run_is_the_newest_comparable_one_with_phases(tmp_path):
    """ps holds a run against the newest earlier run of its job with the same backend and node
    count whose first attempt has phases: not a lost one in between (none stored), not one at
    another host count."""
    from launcher.cli.runs import _previous_phases
    reg = Registry(str(tmp_path / "runs.db"))
    try:
        def run(rid, hosts, stored):
            reg.create(rid, name="job", backend="ssh", hosts=hosts, spec={}, detached=True,
                       supervisor=(0, None), log_dir=str(tmp_path / rid), output_dir=None)
            reg.attempt_started(rid, 0, rid, [], None)
            if stored:
                reg.set_phases(rid, 0, [["rendezvous", 0.0, stored]])
            time.sleep(0.01)
        run("job-1", ["a", "b"], 4.0)
        run("job-2", ["a", "b", "c", "d"], 9.0)   # another node count
        run("job-3", ["a", "b"], None)            # lost: nothing stored
        run("job-4", ["a", "b"], None)            # this one
        now = next(r for r in reg.runs() if r.id == "job-4")
        assert _previous_phases(reg, now) == ("job-1", [("rendezvous", 4.0)])
    finally:
        reg.close()

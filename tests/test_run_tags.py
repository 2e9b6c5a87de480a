"""A run id means the run everywhere; the attempt has its own field and its own process tag
(`<run_id>+a<N>`, a character no run id has), so a run id with `.a` inside (`exp.alpha`,
`X.a1`) is kept whole and is never another run's attempt tag."""
from __future__ import annotations

import pytest

from launcher.errors import UserError
from launcher.plan.launch_plan import RUN_ID_RE, attempt_tag, build_plan, check_run_id
from launcher.spec import validate


def job(tmp_path=None):
    return validate({"name": "t", "trainer": "script", "script": {"path": "x.py"},
                     "cluster": {"hosts": ["localhost"], "gpus_per_node": 1},
                     **({"output_dir": str(tmp_path / "out")} if tmp_path else {})})


@pytest.mark.parametrize("run_id", ["exp.alpha", "exp", "a.a.a", "x.a1b", "X.a1"])
def test_the_run_id_stays_whole_and_the_attempt_has_its_own_field(run_id):
    for attempt in (0, 1, 12):
        plan = build_plan(job(), run_id=run_id, attempt=attempt)
        assert plan.run_id == run_id and plan.attempt == attempt
        assert plan.tag == (run_id if attempt == 0 else f"{run_id}+a{attempt}")
        assert dict(plan.nodes[0].env)["MLAUNCH_RUN_ID"] == plan.tag


def test_no_run_id_is_another_runs_attempt_tag():
    """`X.a1` is a run id of its own; attempt 1 of run X is tagged `X+a1`, which no run id
    can be (check_run_id refuses it)."""
    assert check_run_id("X.a1") == "X.a1"
    assert attempt_tag("X", 1) == "X+a1" and not RUN_ID_RE.fullmatch("X+a1")
    with pytest.raises(UserError):
        check_run_id("X+a1")


def test_a_replanned_attempt_keeps_the_run_and_its_inputs(tmp_path):
    plan = build_plan(job(tmp_path), run_id="exp.alpha", log_dir=str(tmp_path / "logs"))
    nxt = plan.replanned(attempt=2, resume_from="/o/checkpoint-3")
    assert (nxt.run_id, nxt.attempt, nxt.tag, nxt.log_dir) == (
        "exp.alpha", 2, "exp.alpha+a2", plan.log_dir)
    assert nxt.nodes[0].log_path.endswith(".attempt2.log")


def test_the_events_of_a_restart_carry_the_whole_run_id(tmp_path):
    """The watch's event log of attempt 2 of run `exp.alpha` writes run_id `exp.alpha`."""
    import json
    from launcher.watch.watch import Watch
    plan = build_plan(job(tmp_path), run_id="exp.alpha", attempt=2)
    watch = Watch(plan, None, lambda *_: None, lambda: 0.0)
    watch.events.emit("teardown", hosts=["localhost"])
    (line,) = open(watch.events.path).read().splitlines()
    assert json.loads(line)["run_id"] == "exp.alpha" and json.loads(line)["attempt"] == 2

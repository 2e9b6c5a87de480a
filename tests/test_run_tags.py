"""An attempt's tag and its run id: only a trailing `.a<N>` is a restart's tag, so a run id
with `.a` inside (`exp.alpha`) is kept whole in events.jsonl and live.json (it was cut back
to `exp` by split('.a'))."""
from __future__ import annotations

import pytest

from launcher.plan.launch_plan import base_run_id, build_plan
from launcher.spec import validate


@pytest.mark.parametrize("run_id", ["exp.alpha", "exp", "a.a.a", "x.a1b"])
def test_an_attempts_tag_goes_back_to_its_whole_run_id(run_id):
    job = validate({"name": "t", "trainer": "script", "script": {"path": "x.py"},
                    "cluster": {"hosts": ["localhost"], "gpus_per_node": 1}})
    for attempt in (0, 1, 12):
        plan = build_plan(job, run_id=run_id, attempt=attempt)
        assert plan.run_id == (run_id if attempt == 0 else f"{run_id}.a{attempt}")
        assert base_run_id(plan.run_id) == run_id, (attempt, plan.run_id)


def test_the_events_of_a_restart_carry_the_whole_run_id(tmp_path):
    """The watch's event log of attempt 2 of run `exp.alpha` writes run_id `exp.alpha`."""
    import json
    from launcher.execute.watch import Watch
    job = validate({"name": "t", "trainer": "script", "script": {"path": "x.py"},
                    "cluster": {"hosts": ["localhost"], "gpus_per_node": 1},
                    "output_dir": str(tmp_path / "out")})
    plan = build_plan(job, run_id="exp.alpha", attempt=2)
    watch = Watch(plan, None, lambda *_: None, lambda: 0.0)
    watch.events.emit("teardown", hosts=["localhost"])
    (line,) = open(watch.events.path).read().splitlines()
    assert json.loads(line)["run_id"] == "exp.alpha" and json.loads(line)["attempt"] == 2

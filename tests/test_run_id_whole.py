"""A run id with `.a` inside is kept whole through a real restart: `mlaunch submit JOB
--run-id exp.alpha` on localhost, attempt 0 fails, attempt 1 succeeds. The run's events,
its live view and its registry rows all say `exp.alpha`; only the process tag of attempt 1
is `exp.alpha+a1` (tests/test_run_tags.py checks the same of plans and of Watch's events)."""
from __future__ import annotations

import json
import os

import pytest

from launcher.record.events import read_events
from launcher.record.registry import Registry

from .helpers import script_job, write_spec
from .runs import Runs

# Fails (exit 7) while the marker file is absent, after making it; succeeds once it is there.
# Each attempt prints the tag it runs under.
ONCE = """\
import os, sys
marker = sys.argv[1]
tag = os.environ["MLAUNCH_RUN_ID"]
if not os.path.exists(marker):
    open(marker, "w").close()
    print(f"attempt tagged {tag}: failing once", flush=True)
    sys.exit(7)
print(f"attempt tagged {tag}: done", flush=True)
"""


@pytest.mark.launches
def test_a_restarted_run_keeps_its_whole_id_everywhere(tmp_path):
    runs = Runs(str(tmp_path / "home"))
    script = tmp_path / "once.py"
    script.write_text(ONCE)
    (tmp_path / "shared").mkdir()   # the run dir of this test's own
    out = tmp_path / "out"
    spec = script_job(["localhost"], 1, "fail_or_sleep.py", [str(tmp_path / "marker")], str(out),
                      shared_dir=str(tmp_path / "shared"))
    spec["script"]["path"] = str(script)
    spec.update(max_restarts=1, restart_backoff_s=0)
    r = runs.cli("submit", write_spec(tmp_path, spec), "--run-id", "exp.alpha", timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "restart 1/1" in r.stdout, r.stdout

    log_dir = out / "logs" / "exp.alpha"
    events = read_events(str(log_dir / "events.jsonl"))
    assert {e["run_id"] for e in events} == {"exp.alpha"}, events
    assert {e["attempt"] for e in events} == {0, 1}, events
    kinds = [(e["attempt"], e["event"]) for e in events]
    for seen in [(0, "run_start"), (0, "node_exit"), (1, "restart"), (1, "node_exit"), (1, "run_end")]:
        assert seen in kinds, kinds
    assert [e["code"] for e in events if e["event"] == "node_exit"] == [7, 0]

    live = json.loads((log_dir / "live.json").read_text())
    assert live["run_id"] == "exp.alpha", live

    reg = Registry(os.path.join(runs.home, "runs.db"))
    try:
        run, attempts = reg.get("exp.alpha"), reg.attempts("exp.alpha")
    finally:
        reg.close()
    assert (run.id, run.state, run.exit_code, run.attempts) == ("exp.alpha", "succeeded", 0, 2)
    assert [(a.n, a.tag, a.state, a.exit_code) for a in attempts] == [
        (0, "exp.alpha", "failed", 7), (1, "exp.alpha+a1", "succeeded", 0)]
    assert [(a.plan["run_id"], a.plan["attempt"], a.plan["tag"]) for a in attempts] == [
        ("exp.alpha", 0, "exp.alpha"), ("exp.alpha", 1, "exp.alpha+a1")]
    # The processes of each attempt ran under its tag (MLAUNCH_RUN_ID), each in its own log.
    (first,), (second,) = attempts[0].log_paths, attempts[1].log_paths
    assert "attempt tagged exp.alpha: failing once" in open(first).read()
    assert "attempt tagged exp.alpha+a1: done" in open(second).read()

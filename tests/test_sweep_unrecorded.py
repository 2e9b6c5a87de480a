"""stop of a run an older mlaunch recorded (attempts, but no plan in the registry) says that
its hosts are unknown, as a problem: never "no node was started" with processes left."""
from __future__ import annotations

import os

from launcher.backends import backend_for
from launcher.record.registry import Registry


def _run(home: str, attempts: int):
    reg = Registry(os.path.join(home, "runs.db"))
    try:
        reg.create("old", name="job", backend="ssh", hosts=["a"], spec={}, detached=True,
                   supervisor=(0, None), log_dir=None, output_dir=None)
        for n in range(attempts):
            reg.attempt_started("old", n, "old" if n == 0 else f"old.a{n}", ["/l/node0.log"], None)
        return reg.get("old")
    finally:
        reg.close()


def test_a_run_without_recorded_plans_is_a_problem_not_a_clean_stop(tmp_path, monkeypatch):
    monkeypatch.setenv("MLAUNCH_HOME", str(tmp_path / "home"))
    got = backend_for("ssh").reach_nodes(_run(str(tmp_path / "home"), 1), force=False)
    assert not got.clean and got.problems == [
        "run old started 1 attempt(s) but the registry holds no plan of it (an older mlaunch "
        "recorded it): its hosts are unknown here; end its processes on each of its hosts by "
        "hand (each carries MLAUNCH_RUN_ID=old in its environment)"]


def test_a_run_that_started_nothing_is_a_clean_stop(tmp_path, monkeypatch):
    monkeypatch.setenv("MLAUNCH_HOME", str(tmp_path / "home"))
    got = backend_for("ssh").reach_nodes(_run(str(tmp_path / "home"), 0), force=False)
    assert got.clean and got.how.startswith("no node was started")

"""A real LLaMA-Factory LoRA run, detached: a worker killed after a checkpoint, one restart."""
from __future__ import annotations

import os

import pytest

from .runs import Runs
from .training import build_tiny, lf_spec, require_trainer, trainer_state, worker_killed

pytestmark = [pytest.mark.multihost, pytest.mark.training]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    require_trainer()
    return build_tiny(str(tmp_path_factory.mktemp("tiny")))


def test_detached_lora_resumes_after_a_killed_worker(make_hostset, tmp_path, tiny):
    runs = Runs(str(tmp_path / "home"))
    out = str(tmp_path / "out")
    with make_hostset(2) as hs:
        spec = lf_spec(tiny, [h.ip for h in hs.hosts], 1, out, hs=hs, max_steps=10,
                       save_steps=5, max_restarts=1, restart_backoff_s=1)
        with worker_killed(hs.hosts[1].pids, os.path.join(out, "checkpoint-5", "trainer_state.json"),
                           b"llamafactory.launcher") as killed:
            run_id = runs.detach(tmp_path, spec)
            row = runs.wait_state(run_id, ("succeeded", "failed", "stopped", "lost"), timeout=900)
    assert killed, "no worker was killed"
    console = open(runs.console_path(run_id)).read()
    assert row["state"] == "succeeded" and row["exit_code"] == 0, console[-4000:]
    assert trainer_state(out)["global_step"] == 10
    assert row["attempts"] == 2 and row["resumed_from"] == f"{out}/checkpoint-5", row
    attempts = runs.attempts(run_id)
    assert [(a.n, a.state, a.exit_code, a.resumed_from) for a in attempts] == [
        (0, "failed", 137, None), (1, "succeeded", 0, f"{out}/checkpoint-5")]
    assert all(os.path.exists(p) for a in attempts for p in a.log_paths)
    assert "restart 1/1: resuming from" in console

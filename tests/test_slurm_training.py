"""Real LLaMA-Factory on the Slurm test cluster: 2 nodes x 2 processes, CPU, gloo."""
from __future__ import annotations

import os

import pytest

from .runs import Runs
from .slurmjobs import baseline, leftovers, slurm_cluster, submit
from .training import (TRAINER_PYTHON, build_tiny, lf_spec, losses,
                       require_trainer, trainer_state, worker_killed)

pytestmark = [pytest.mark.multihost, pytest.mark.training]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    require_trainer()
    return build_tiny(str(tmp_path_factory.mktemp("tiny")))


def slurm_lf(tmp_path, tiny, out: str, **kw) -> dict:
    spec = lf_spec(tiny, [], 2, out, **kw)
    spec["cluster"] = {**slurm_cluster(tmp_path), "python": TRAINER_PYTHON,
                       "env": spec["cluster"]["env"]}
    return spec


def test_lora_2_nodes_x_2_processes(slurm2, tmp_path, tiny):
    keep = baseline(slurm2)
    out = str(tmp_path / "out")
    r = submit(slurm2, tmp_path, slurm_lf(tmp_path, tiny, out), "--no-preflight", timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    state = trainer_state(out)
    assert state["global_step"] == 6
    assert sorted(losses(state)) == list(range(1, 7))
    assert os.path.isfile(os.path.join(out, "checkpoint-3", "trainer_state.json"))
    run_dir = os.path.join(out, "logs", os.listdir(os.path.join(out, "logs"))[0])
    names = [h.name for h in slurm2.hs.hosts]
    assert sorted(p for p in os.listdir(run_dir) if p.startswith("node")) == [
        f"node{k}-{n}.log" for k, n in enumerate(names)]
    assert leftovers(slurm2, keep) == {n: set() for n in names}


def test_killed_worker_restarts_from_its_checkpoint_as_a_new_job(slurm2, tmp_path, tiny):
    keep = baseline(slurm2)
    out = str(tmp_path / "out")
    runs = Runs(str(tmp_path / "home"))
    runs.env["SLURM_CONF"] = slurm2.conf
    spec = slurm_lf(tmp_path, tiny, out, max_steps=10, save_steps=5, max_restarts=1,
                    restart_backoff_s=1)
    with worker_killed(slurm2.hs.hosts[1].pids, os.path.join(out, "checkpoint-5", "trainer_state.json"),
                       b"llamafactory.launcher") as killed:
        run_id = runs.detach(tmp_path, spec)
        row = runs.wait_state(run_id, ("succeeded", "failed", "stopped", "lost"), timeout=900)
    assert killed, "no worker was killed"
    console = open(runs.console_path(run_id)).read()
    assert row["state"] == "succeeded" and row["exit_code"] == 0, console[-4000:]
    assert trainer_state(out)["global_step"] == 10
    assert f"restart 1/1: resuming from {out}/checkpoint-5" in console
    assert row["attempts"] == 2 and row["resumed_from"] == f"{out}/checkpoint-5", row
    attempts = runs.attempts(run_id)
    assert [(a.n, a.state, a.exit_code, a.resumed_from) for a in attempts] == [
        (0, "failed", 137, None), (1, "succeeded", 0, f"{out}/checkpoint-5")]
    assert len(row["handle"]["job_ids"]) == 2, row["handle"]   # two chained sbatch jobs
    assert all(os.path.exists(p) for a in attempts for p in a.log_paths)
    assert leftovers(slurm2, keep) == {h.name: set() for h in slurm2.hs.hosts}

"""Real LLaMA-Factory LoRA through `cluster.scheduler: ray` on a real 3-node Ray cluster
(tests/hostkit/raycluster.py), CPU and gloo, the tiny model and data on the file system every
namespace host sees (as the SSH tests reach them): an uninterrupted 20-step run on 2 Ray
nodes, and the same run with a worker killed after checkpoint-5, restarted on a new
placement group and resumed there, whose steps 6-20 have the uninterrupted run's losses."""
from __future__ import annotations

import os

import pytest

from .raynodes import run_procs_left
from .runs import Runs
from .training import (KILLED_OR_PEER, TRAINER_PYTHON, attempt_exit, build_tiny, held_at, lf_spec,
                       losses, require_trainer, submit_timed, trainer_state, worker_killed)

pytestmark = [pytest.mark.multihost, pytest.mark.training]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    require_trainer()
    return build_tiny(str(tmp_path_factory.mktemp("tiny")))


def ray_lf(cluster, tiny, out: str, nodes: int = 2, **kw) -> dict:
    """lf_spec's tiny LoRA job on the Ray cluster: one bundle of one CPU per node, 1 process each;
    the trainer runs on the trainer venv, which has no ray."""
    spec = lf_spec(tiny, [], 1, out, **kw)
    spec["cluster"] = {"scheduler": "ray", "gpus_per_node": 1, "python": TRAINER_PYTHON,
                       "master_port": spec["cluster"]["master_port"], "env": spec["cluster"]["env"],
                       "ray": {"address": cluster.address, "nodes": nodes, "resources": {"CPU": 1}}}
    return spec


@pytest.fixture(scope="module")
def ref20(ray3, tiny, tmp_path_factory) -> str:
    """The output_dir of an uninterrupted 20-step LoRA run on 2 Ray nodes × 1, through
    submit's preflight (run through the Ray agents)."""
    base = tmp_path_factory.mktemp("rayref")
    out = str(base / "out")
    r = submit_timed(base, ray_lf(ray3, tiny, out, max_steps=20, save_steps=5), preflight=True,
                     timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr
    assert "preflight" in r.stdout and "[node1 bundle1" in r.stdout
    assert trainer_state(out)["global_step"] == 20
    return out


def test_lora_through_ray_and_a_killed_worker_resumes_like_the_uninterrupted_run(ray3, tmp_path, tiny, ref20):
    runs = Runs(str(tmp_path / "home"))
    out = str(tmp_path / "out")
    spec = held_at(ray_lf(ray3, tiny, out, max_steps=20, save_steps=5, max_restarts=1,
                          restart_backoff_s=1), 5, str(tmp_path / "hold"))
    every_host = lambda: set().union(*(h.pids() for h in ray3.hs))  # noqa: E731
    with worker_killed(every_host, os.path.join(out, "checkpoint-5", "trainer_state.json"),
                       b"llamafactory.launcher", release=str(tmp_path / "hold")) as killed:
        run_id = runs.detach(tmp_path, spec)
        row = runs.wait_state(run_id, ("succeeded", "failed", "stopped", "lost"), timeout=900)
    assert killed, "no worker was killed"
    console = open(runs.console_path(run_id)).read()
    assert row["state"] == "succeeded" and row["exit_code"] == 0, console[-4000:]
    assert row["backend"] == "ray" and row["attempts"] == 2, row
    assert attempt_exit(console, 0) in KILLED_OR_PEER, console[-3000:]
    assert f"restart 1/1: resuming from {out}/checkpoint-5" in console
    state = trainer_state(out)
    got, ref = losses(state), losses(trainer_state(ref20))
    assert state["global_step"] == 20 and sorted(got) == list(range(1, 21))
    for step in range(6, 21):   # the 15 steps after the kill
        assert got[step] == pytest.approx(ref[step], rel=1e-5, abs=1e-6), (step, got, ref)
    assert run_procs_left(ray3, run_id) == {h.name: set() for h in ray3.hs}

"""Real LLaMA-Factory on the Slurm test cluster (CPU, gloo): 2 nodes x 1 process with a restart,
and a ZeRO-2 shrink from 3 nodes to 2. (2 processes per node through sbatch and torchrun:
test_slurm_backend.py's 2 x 2 all-reduce; a trainer rank more per node costs ~8 s of CPU.)"""
from __future__ import annotations

import os

import pytest

from launcher.record.events import read_events

from .runs import Runs
from .slurmjobs import baseline, drain_and_kill, leftovers, slurm_cluster
from .loadfactor import limit
from .training import (KILLED_OR_PEER, TRAINER_PYTHON, adam_moments, adam_steps, build_tiny, held_at, lf_spec,
                       losses, require_trainer, same_optimizer_state, submit_and_cut, trainer_state,
                       uninterrupted, worker_killed)

pytestmark = [pytest.mark.multihost, pytest.mark.training]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    require_trainer()
    return build_tiny(str(tmp_path_factory.mktemp("tiny")))


def slurm_lf(tmp_path, tiny, out: str, **kw) -> dict:
    spec = lf_spec(tiny, [], 1, out, **kw)
    spec["cluster"] = {**slurm_cluster(tmp_path, nproc=1), "python": TRAINER_PYTHON,
                       "env": spec["cluster"]["env"]}
    return spec


def test_killed_worker_restarts_from_its_checkpoint_as_a_new_job(slurm2, tmp_path, tiny):
    """LoRA on 2 nodes × 1 process, detached; a worker killed after checkpoint-5: the
    restart is a second sbatch job resuming there and training 15 more steps, each with the
    loss of the same spec run uninterrupted at world 2 on localhost (rel 1e-5: Adam's moments
    restored, or the steps after the first would differ). Its first attempt is also the plain
    2-node run (node logs named after the Slurm nodes, nothing left behind)."""
    keep = baseline(slurm2)
    out = str(tmp_path / "out")
    runs = Runs(str(tmp_path / "home"))
    runs.env["SLURM_CONF"] = slurm2.conf
    spec = held_at(slurm_lf(tmp_path, tiny, out, max_steps=20, save_steps=5, max_restarts=1,
                            restart_backoff_s=1), 5, str(tmp_path / "hold"))
    with worker_killed(slurm2.hs.hosts[1].pids, os.path.join(out, "checkpoint-5", "trainer_state.json"),
                       b"llamafactory.launcher", release=str(tmp_path / "hold")) as killed:
        run_id = runs.detach(tmp_path, spec)
        row = runs.wait_state(run_id, ("succeeded", "failed", "stopped", "lost"), timeout=900)
    assert killed, "no worker was killed"
    console = open(runs.console_path(run_id)).read()
    assert row["state"] == "succeeded" and row["exit_code"] == 0, console[-4000:]
    state = trainer_state(out)
    assert state["global_step"] == 20 and sorted(losses(state)) == list(range(1, 21))
    assert f"restart 1/1: resuming from {out}/checkpoint-5" in console
    assert row["attempts"] == 2 and row["resumed_from"] == f"{out}/checkpoint-5", row
    attempts = runs.attempts(run_id)
    assert attempts[0].exit_code in KILLED_OR_PEER, console[-3000:]
    assert [(a.n, a.state, a.exit_code, a.resumed_from) for a in attempts] == [
        (0, "failed", attempts[0].exit_code, None), (1, "succeeded", 0, f"{out}/checkpoint-5")]
    assert len(row["handle"]["job_ids"]) == 2, row["handle"]   # two chained sbatch jobs
    assert all(os.path.exists(p) for a in attempts for p in a.log_paths)
    run_dir = os.path.join(out, "logs", os.listdir(os.path.join(out, "logs"))[0])
    # the failure seen is marked (teardown), so the report gives the time back to training
    from launcher.record import phases
    timeline = phases.timeline(read_events(os.path.join(run_dir, "events.jsonl")))
    assert [p.name for p in phases.of_attempt(timeline, 0)][-1:] == ["teardown"], timeline
    assert list(phases.back_to_training_s(timeline)) == [1], timeline
    names = [h.name for h in slurm2.hs.hosts]
    assert sorted(p for p in os.listdir(run_dir) if p.startswith("node") and ".attempt" not in p) == [
        f"node{k}-{n}.log" for k, n in enumerate(names)]
    assert leftovers(slurm2, keep) == {h.name: set() for h in slurm2.hs.hosts}
    got = losses(state)
    want = uninterrupted(tmp_path, lf_spec(tiny, ["localhost"], 2, str(tmp_path / "reference"),
                                           max_steps=20, save_steps=5))
    print(f"[losses] Slurm, restarted from checkpoint-5: {got}; uninterrupted: {want}")
    for step in range(1, 21):
        assert got[step] == pytest.approx(want[step], rel=1e-5), (step, got, want)


def test_zero2_drained_node_shrinks_3_to_2_through_a_universal_conversion_job(slurm3, tmp_path, tiny):
    """Issue 29 under Slurm with ZeRO: full fine-tuning, ZeRO-2, 3 nodes × 1, min_nodes 2, global
    batch 12 = 3 × 2 × 2. Once checkpoint-3 is saved, node 2 is drained and its rank killed.
    The restart excludes it, asks for 2 nodes with grad_accum 3 (global batch 12 kept); the
    checkpoint saved by 3 ranks is converted to DeepSpeed's universal one in a one-node Slurm
    job of its own (no node is held between attempts), and the 2-node job loads it and trains
    12 steps, each within 0.5 % of the same job run uninterrupted at world 2 on localhost (the
    same 12 samples a step at either world; measured: equal to the 4 decimals logged); its checkpoints after the
    load hold Adam's step equal to their global step, and checkpoint-15's moments are the
    uninterrupted run's (same_optimizer_state)."""
    import re
    keep = baseline(slurm3)
    out = str(tmp_path / "out")
    sched = {"finetuning": {"type": "full"}, "deepspeed": {"stage": 2}, "max_steps": 15, "save_steps": 3}
    spec = lf_spec(tiny, [], 1, out, max_restarts=1, restart_backoff_s=1, **sched)
    spec["cluster"] = {**slurm_cluster(tmp_path, nproc=1, nodes=3), "python": TRAINER_PYTHON,
                       "env": spec["cluster"]["env"], "min_nodes": 2}
    spec["batch"] = {"per_device": 2, "grad_accum": 2}
    # Held after checkpoint-3 until the kill: unheld, a loaded machine's training reached
    # max_steps before it (CI, 2026-12-04: no restart at all)
    hold = str(tmp_path / "hold")
    spec = held_at(spec, 3, hold)
    lost = []

    def cut(console: str) -> None:   # node 2 of the first attempt
        try:
            first = re.search(r"slurm job (\d+) running on (\S+), (\S+), (\S+)\n", console)
            assert first, console
            lost.append(first.group(4))
            drain_and_kill(slurm3, lost[0])
        finally:   # a failed cut must not leave the trainers held on the module's cluster
            open(os.path.join(hold, "release"), "w").close()
    code, console = submit_and_cut(tmp_path, spec, os.path.join(out, "checkpoint-3", "trainer_state.json"),
                                   cut, "--no-preflight", env={"SLURM_CONF": slurm3.conf})
    lost = lost[0]
    assert code == 0, console[-4000:]
    assert (f"shrink: excluded {lost}, which leaves 2 usable node(s) of the 3 asked in partition "
            "debug; the next attempt runs on 2 nodes, world 3 -> 2 processes, grad_accum 2 -> 3, "
            "global batch 12 = 2 × 2 per device × 3 (kept)") in console, console[-4000:]
    ckpt = f"{out}/checkpoint-3"
    assert (f"resume: {ckpt} was saved at world 3; converted to DeepSpeed's universal checkpoint "
            "on a one-node Slurm job (srun) (ds_to_universal), loaded at world 2") in console, console[-4000:]
    assert os.path.exists(f"{ckpt}/global_step3_universal/.mlaunch-complete")
    state = trainer_state(out)
    got = losses(state)
    assert state["global_step"] == 15 and sorted(got) == list(range(1, 16)), got
    jobs = re.findall(r"slurm job (\d+): (\d) nodes requested", console)
    assert [n for _, n in jobs] == ["3", "2"], console[-4000:]
    assert leftovers(slurm3, keep) == {h.name: set() for h in slurm3.hs.hosts}
    ref_out = str(tmp_path / "reference")
    ref = lf_spec(tiny, ["localhost"], 2, ref_out, **sched)
    ref["batch"] = {"per_device": 2, "grad_accum": 3}
    want = uninterrupted(tmp_path, ref, timeout=limit(900))
    rel = {s: got[s] / want[s] - 1 for s in range(4, 16)}
    print("[losses] Slurm ZeRO-2 shrunk 3 -> 2 after step 3: step, shrunk, uninterrupted world 2, "
          "relative difference: " + "; ".join(f"{s} {got[s]:.4f} {want[s]:.4f} {rel[s]:+.2%}" for s in rel))
    assert all(abs(v) < 0.005 for v in rel.values()), rel
    for step in (6, 15):
        steps = adam_steps(f"{out}/checkpoint-{step}")
        assert len(steps) == 2 and all(v == [step] for v in steps.values()), (step, steps)
    bad = same_optimizer_state(adam_moments(f"{out}/checkpoint-15"), adam_moments(f"{ref_out}/checkpoint-15"), 15)
    assert not bad, bad

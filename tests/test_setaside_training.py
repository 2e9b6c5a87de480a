"""A save never lands in another world's folder, trained: LLaMA-Factory full fine-tuning with
ZeRO-2 on localhost. An older run at world 2 (another learning rate, so another trajectory)
leaves checkpoint-4 with two ranks' optimizer shards; the new run starts over it with
`--overwrite` at world 1 and is killed once it has saved its own checkpoint-4. Before, that
save landed in the old folder beside the old run's rank-1 shard, the folder read as world 2's,
and the restart converted a mix of both trainings. Now the old folder is set aside before
attempt 0, and the restart resumes the new run's own checkpoint at its own world."""
from __future__ import annotations

import glob
import os

import pytest

from .training import (adam_moments, build_tiny, by_attempt, held_at, lf_spec, local_job_pids, logged,
                       same_optimizer_state, submit_and_cut, submit_timed, worker_killed)

pytestmark = pytest.mark.training


def spec_of(tiny, out: str, world: int, **extra) -> dict:
    spec = lf_spec(tiny, ["localhost"], world, out, finetuning={"type": "full"}, deepspeed={"stage": 2},
                   max_steps=12, save_steps=4, **extra)
    spec["batch"]["grad_accum"] = 2 // world   # global batch 4 at either world
    return spec


def test_overwrite_at_a_smaller_world_resumes_its_own_shards_and_trains_the_same_curve(tmp_path):
    tiny = build_tiny(str(tmp_path / "tiny"))
    out, whole, hold = str(tmp_path / "out"), str(tmp_path / "whole"), str(tmp_path / "hold")
    old = spec_of(tiny, out, 2) | {"name": "older"}
    old["training"] |= {"max_steps": 4, "learning_rate": 1.0e-2}
    r = submit_timed(tmp_path, old)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    old_shards = sorted(os.listdir(glob.glob(os.path.join(out, "checkpoint-4", "global_step*"))[0]))
    assert len([s for s in old_shards if s.endswith("optim_states.pt")]) == 2, old_shards
    r = submit_timed(tmp_path, spec_of(tiny, whole, 1) | {"name": "whole"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    reference = dict(logged(whole))

    spec = held_at(spec_of(tiny, out, 1, max_restarts=1, restart_backoff_s=0) | {"name": "again"}, 4, hold)
    with worker_killed(local_job_pids("again"), os.path.join(hold, "held-4-rank*"), b"llamafactory",
                       release=hold) as killed:
        code, console = submit_and_cut(tmp_path, spec, lambda: killed, lambda _: None, "--overwrite",
                                       "--no-preflight")
    assert code == 0 and killed, console[-4000:]
    aside = glob.glob(os.path.join(out, "mlaunch-set-aside", "again-*-attempt0", "checkpoint-4"))
    assert len(aside) == 1, console[-4000:]
    assert sorted(os.listdir(glob.glob(os.path.join(aside[0], "global_step*"))[0])) == old_shards
    assert f"output_dir: checkpoint-4 moved to {os.path.dirname(aside[0])} before attempt 0" in console
    assert f"resuming from {out}/checkpoint-4" in console, console[-4000:]
    assert "universal" not in console, console[-4000:]   # its own world's checkpoint: nothing converted
    _, after = by_attempt(logged(out), resumed=4)
    steps = sorted(s for s in after if s > 4)
    assert steps == list(range(5, 13)), logged(out)
    for s in steps:
        print(f"step {s}: uninterrupted {reference[s]:.4f}, set aside and resumed {after[s]:.4f}")
        assert after[s] == pytest.approx(reference[s], rel=0.005), (s, after, reference)
    got, want = (adam_moments(os.path.join(d, "checkpoint-12")) for d in (out, whole))
    assert len(got) == 1 and not same_optimizer_state(got, want, 12), (got, want)

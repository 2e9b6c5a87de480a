"""Real LLaMA-Factory training through `mlaunch submit`: 2 hosts x 1 process, CPU, gloo.

Each test checks outcomes, not logs: exit 0, global_step == max_steps, losses logged,
weights saved and reloadable.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess

import pytest


from .loadfactor import limit
from .procs import own_name
from .training import (KILLED_OR_PEER, TRAINER_PYTHON, attempt_exit, build_tiny, held_at, lf_spec,
                       local_job_pids, losses, require_trainer, submit_timed, trainer_state, worker_killed)

pytestmark = [pytest.mark.multihost, pytest.mark.training]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    require_trainer()
    return build_tiny(str(tmp_path_factory.mktemp("tiny")))




def assert_trained(r, out: str, steps: int) -> dict:
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    state = trainer_state(out)
    assert state["global_step"] == steps
    got = losses(state)
    assert sorted(got) == list(range(1, steps + 1)) and all(v == v and v > 0 for v in got.values())
    return state


def reload_ok(code: str) -> None:
    """Run a reload snippet in the trainer venv; it must print OK."""
    r = subprocess.run([TRAINER_PYTHON, "-c", code], capture_output=True, text=True, timeout=limit(300))
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-2000:]


def reload_adapter(model: str, out: str) -> None:
    reload_ok(
        "import torch, peft, transformers as t\n"
        f"m = t.AutoModelForCausalLM.from_pretrained({model!r})\n"
        f"m = peft.PeftModel.from_pretrained(m, {out!r})\n"
        "x = torch.tensor([[1, 2, 3]]); assert m(x).logits.shape[-1] > 0; print('OK')\n")


def reload_full(out: str) -> None:
    reload_ok(
        "import torch, transformers as t\n"
        f"m = t.AutoModelForCausalLM.from_pretrained({out!r})\n"
        "x = torch.tensor([[1, 2, 3]]); assert m(x).logits.shape[-1] > 0; print('OK')\n")


VARIANTS = {  # name: (finetuning, deepspeed). LoRA without DeepSpeed is the ref20 run below;
    # LoRA under ZeRO-2 and full under ZeRO-3 are test_deepspeed_training's weight-decay runs,
    # which check the same outputs (assert_outputs): one trainer run each fewer.
    "freeze": ({"type": "freeze", "freeze_trainable_layers": 1}, None),
    "full": ({"type": "full"}, None),
}


def assert_outputs(out: str, tiny: dict, *, lora: bool, zero: bool) -> None:
    """What every trained variant leaves: checkpoint-3, DeepSpeed's own shards (one per rank,
    2 ranks) under ZeRO, weights that reload, and one log per node holding its own lines."""
    assert os.path.isfile(os.path.join(out, "checkpoint-3", "trainer_state.json"))
    if zero:
        shards = os.listdir(os.path.join(out, "checkpoint-3", "global_step3"))
        assert len([s for s in shards if s.endswith("optim_states.pt")]) == 2, shards
    if lora:
        reload_adapter(tiny["model"], out)
    else:
        reload_full(out)
    assert node_logs(out) == ["node0", "node1"]


def node_logs(out: str) -> list[str]:
    """node<k> of each node log of the run in out (beside them: events.jsonl)."""
    run_dir = os.path.join(out, "logs", os.listdir(os.path.join(out, "logs"))[0])
    return sorted(re.sub(r"-.*", "", p) for p in os.listdir(run_dir) if p.startswith("node"))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_train_variants(make_hostset, tmp_path, tiny, variant):
    finetuning, deepspeed = VARIANTS[variant]
    out = str(tmp_path / "out")
    with make_hostset(2) as hs:
        spec = lf_spec(tiny, [h.ip for h in hs.hosts], 1, out, hs=hs, finetuning=finetuning,
                       deepspeed=deepspeed)
        if variant == "full":  # rendered files written once to shared storage, not uploaded
            spec["cluster"]["shared_dir"] = str(tmp_path / "shared")
        r = submit_timed(tmp_path, spec)
        if variant == "full":
            assert os.listdir(tmp_path / "shared" / ".mlaunch")
    assert_trained(r, out, 6)
    assert_outputs(out, tiny, lora=False, zero=False)


@pytest.fixture(scope="module")
def ref20_run(tiny, tmp_path_factory) -> tuple[str, str]:
    """(output_dir, console) of an uninterrupted 20-step LoRA run on 2 hosts × 1 through
    submit's preflight, as users' runs go, a checkpoint every 5 steps: the LoRA variant's outputs,
    the restart test's reference losses and the half-checkpoint test's checkpoint-5 (two
    trainer runs fewer than each making its own)."""
    from . import hosts as _hosts
    if (reason := _hosts.skip_reason()) is not None:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("ref20")
    out = str(base / "out")
    with _hosts.make_hosts(2) as hs:
        r = submit_timed(base, lf_spec(tiny, [h.ip for h in hs.hosts], 1, out, hs=hs, max_steps=20,
                                       save_steps=5), preflight=True)
    assert_trained(r, out, 20)
    return out, r.stdout


@pytest.fixture(scope="module")
def ref20(ref20_run) -> str:
    return ref20_run[0]


def test_lora_trains_through_preflight_and_reloads(ref20_run, tiny):
    out, console = ref20_run
    assert "preflight" in console
    assert os.path.isfile(os.path.join(out, "checkpoint-5", "trainer_state.json"))
    reload_adapter(tiny["model"], out)
    assert node_logs(out) == ["node0", "node1"]


def test_restart_resumes_and_matches_uninterrupted_run(make_hostset, tmp_path, tiny, ref20):
    """A detached run (submit -d) whose worker on host 1 is killed after checkpoint-5: one
    automatic restart resumes there, steps 6-20 have the uninterrupted run's losses, and the
    registry records both attempts (one trainer run serves the restart and the detach tests)."""
    from .runs import Runs
    runs = Runs(str(tmp_path / "home"))
    out = str(tmp_path / "out")
    ref_state = trainer_state(ref20)
    with make_hostset(2) as hs:
        hosts = [h.ip for h in hs.hosts]
        spec = held_at(lf_spec(tiny, hosts, 1, out, hs=hs, max_steps=20, save_steps=5, max_restarts=1,
                               restart_backoff_s=1), 5, str(tmp_path / "hold"))
        with worker_killed(hs.hosts[1].pids, os.path.join(out, "checkpoint-5", "trainer_state.json"),
                           b"llamafactory.launcher", release=str(tmp_path / "hold")) as killed:
            run_id = runs.detach(tmp_path, spec)
            row = runs.wait_state(run_id, ("succeeded", "failed", "stopped", "lost"), timeout=900)
    assert killed, "no worker was killed"
    console = open(runs.console_path(run_id)).read()
    assert row["state"] == "succeeded" and row["exit_code"] == 0, console[-4000:]
    assert row["attempts"] == 2 and row["resumed_from"] == f"{out}/checkpoint-5", row
    attempts = runs.attempts(run_id)
    first = attempt_exit(console, 0)
    assert first in KILLED_OR_PEER, console[-3000:]
    assert [(a.n, a.state, a.exit_code, a.resumed_from) for a in attempts] == [
        (0, "failed", first, None), (1, "succeeded", 0, f"{out}/checkpoint-5")]
    assert all(os.path.exists(p) for a in attempts for p in a.log_paths)
    state = trainer_state(out)
    assert state["global_step"] == 20
    got = losses(state)
    assert sorted(got) == list(range(1, 21)) and all(v == v and v > 0 for v in got.values())
    assert "restart 1/1: resuming from" in console and f"{out}/checkpoint-5" in console
    assert attempt_exit(console, 1) == 0
    ref_loss = losses(ref_state)
    for step in range(6, 21):
        assert got[step] == pytest.approx(ref_loss[step], rel=1e-5, abs=1e-6), (step, got, ref_loss)
    logs = os.listdir(os.path.join(out, "logs", os.listdir(os.path.join(out, "logs"))[0]))
    assert any(".attempt1." in name for name in logs)
    check_phases(out, attempts)


def check_phases(out: str, attempts) -> None:
    """The restarted LLaMA-Factory run's phase timeline (record/phases.py): LLaMA-Factory's
    own lines close rendezvous, data, model and (when its line came before the first step's)
    trainer setup in each attempt; the restart's
    phases come between; the registry holds the same; each attempt's first_step event ends
    its first-step phase."""
    from launcher.record import phases
    from launcher.record.events import read_events
    (path,) = glob.glob(f"{out}/logs/*/events.jsonl")
    events = read_events(path)
    got = phases.timeline(events)
    start = ["stage", "start", "rendezvous", "data", "model", "trainer setup", "first step", "training"]
    names = {n: [p.name for p in phases.of_attempt(got, n)] for n in (0, 1)}
    # The Trainer's "Running training" goes to stderr and the step's loss to stdout; torchrun's
    # tee reads the two in threads of their own, so when the first step comes within its poll
    # (a resumed tiny run: 50 ms) the loss line may reach mlaunch first. The stage is then
    # folded into the first step, as any stage no line told of in time is (docs/design.md).
    folded = [p for p in start if p != "trainer setup"]
    assert names[0] in [["connect", "checkpoint"] + seq + ["teardown", "settle"] for seq in (start, folded)], names   # submit -d: --no-preflight
    assert names[1] in [["backoff", "decide", "checkpoint"] + seq for seq in (start, folded)], names   # resumed at 6, past 5: no catch-up
    assert [[p[0] for p in a.phases] for a in attempts] == [names[0], names[1]]
    origin = phases._t(next(e for e in events if e["event"] == "phase"))
    for n in (0, 1):
        (first,) = [(phases._t(e) - origin).total_seconds() for e in events
                    if e["event"] == "first_step" and e["attempt"] == n]
        p = next(p for p in phases.of_attempt(got, n) if p.name == "first step")
        assert first == pytest.approx(p.start_s + p.seconds, abs=2e-3)
    assert set(phases.back_to_training_s(got)) == {1}


def test_restart_after_overwrite_ignores_the_older_runs_checkpoint(tmp_path, tiny, ref20):
    """--overwrite moves an older run's checkpoint-100 whole into output_dir/mlaunch-set-aside/
    (nothing is deleted); an automatic restart must resume from this run's checkpoint-5, not
    from that one."""
    out, name = str(tmp_path / "out"), own_name("overwrite-restart")
    old = os.path.join(out, "checkpoint-100")
    # An older run's complete checkpoint of step 100: the shared 20-step run's checkpoint-5,
    # renamed (it is never loaded; a trainer run of its own cost 13 s of CPU).
    shutil.copytree(os.path.join(ref20, "checkpoint-5"), old)
    state_path = os.path.join(old, "trainer_state.json")
    state = json.load(open(state_path))
    json.dump({**state, "global_step": 100}, open(state_path, "w"))
    spec = held_at(lf_spec(tiny, ["localhost"], 1, out, max_steps=10, save_steps=5, max_restarts=1,
                           restart_backoff_s=1, name=name), 5, str(tmp_path / "hold"))
    with worker_killed(local_job_pids(name), os.path.join(out, "checkpoint-5", "trainer_state.json"),
                       b"llamafactory.launcher", release=str(tmp_path / "hold")) as killed:
        r = submit_timed(tmp_path, spec, "--overwrite")
    assert killed, "no worker was killed"
    assert f"restart 1/1: resuming from {out}/checkpoint-5" in r.stdout, r.stdout[-3000:]
    assert_trained(r, out, 10)
    (kept,) = glob.glob(os.path.join(out, "mlaunch-set-aside", f"{name}-*-attempt0", "checkpoint-100"))
    assert not os.path.exists(old) and f"output_dir: checkpoint-100 moved to {os.path.dirname(kept)}" in r.stdout
    kept_state = json.load(open(os.path.join(kept, "trainer_state.json")))
    assert kept_state == {**state, "global_step": 100}, "the older run's checkpoint changed"


def test_resume_skips_planted_half_checkpoint(make_hostset, tmp_path, tiny, ref20):
    """An output_dir whose complete checkpoint-5 is the reference run's (same spec, same world)
    and a half-written checkpoint-10 planted beside it: --resume takes checkpoint-5, and the
    resumed steps 6-20 have the reference's losses."""
    out = str(tmp_path / "out")
    os.makedirs(out)
    shutil.copytree(os.path.join(ref20, "checkpoint-5"), os.path.join(out, "checkpoint-5"))
    with make_hostset(2) as hs:
        spec = lf_spec(tiny, [h.ip for h in hs.hosts], 1, out, hs=hs, max_steps=20, save_steps=5)
        half = os.path.join(out, "checkpoint-10")
        os.makedirs(half)
        with open(os.path.join(half, "adapter_model.safetensors"), "wb") as fh:
            fh.write(b"half")
        r = submit_timed(tmp_path, spec, "--resume")
    assert "checkpoint-10: no trainer_state.json (interrupted save?) — using checkpoint-5" in r.stdout
    assert f"resuming from {out}/checkpoint-5" in r.stdout
    state = trainer_state(out)
    assert r.returncode == 0 and state["global_step"] == 20
    assert os.path.exists(os.path.join(half, "adapter_model.safetensors")), "mlaunch deleted a file"
    assert json.load(open(os.path.join(out, "checkpoint-5", "trainer_state.json")))["global_step"] == 5
    got, want = losses(state), losses(trainer_state(ref20))
    for step in range(6, 21):
        assert got[step] == pytest.approx(want[step], rel=1e-5, abs=1e-6), (step, got, want)

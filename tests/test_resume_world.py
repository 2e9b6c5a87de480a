"""Issue 50: a resume at another world converts before attempt 0. `submit --resume` of a
DeepSpeed job looks at the checkpoint before its first attempt; saved at another world, node 0
converts it to DeepSpeed's universal checkpoint (as before a shrunk restart) and attempt 0
loads it. The unit tests run the real conversion script (templates/universal.sh.j2) in a
local shell with tests/test_universal.py's stand-in ds_to_universal; the last test trains:
ZeRO-2 full fine-tuning saved at world 2 on localhost, resumed at world 1, and the other way."""
from __future__ import annotations

import glob
import json
import math
import os
import shutil

import pytest

from .helpers import plan_of

from launcher.errors import UserError
from launcher.runs import attempts, universal
from launcher.runs.attempts import SubmitOptions
from launcher.record.events import read_events
from launcher.spec import validate

from .test_run_end import Master, Rec, fails_once
from .test_shrink import lora
from .test_spares import Events, Said
from .test_universal import FAKE_CONVERTER, ShellExecutor, checkpoint


class Counted(ShellExecutor):
    """ShellExecutor that counts its calls; run_step (Slurm's one-node job) runs the same shell."""

    def __init__(self, env=None):
        super().__init__(env)
        self.runs, self.steps = 0, 0

    def run(self, login, script, timeout):
        self.runs += 1
        return super().run(login, script, timeout)

    def run_step(self, plan, name, script, timeout):
        self.steps += 1
        return super().run("node0", script, timeout)


def zero(tmp_path, hosts=2, deepspeed=None, **cluster):
    """LoRA + ZeRO-2 on `hosts` nodes × 1 process, no min_nodes (a plain job, no shrink);
    cluster.python is the stand-in converter."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "python").write_text(FAKE_CONVERTER)
    (bindir / "python").chmod(0o755)
    data = lora(hosts=hosts, gpus=1, per_device=1, grad_accum=6 // hosts) | {
        "deepspeed": deepspeed or {"stage": 2}, "output_dir": str(tmp_path / "out")}
    data["cluster"].update(python=str(bindir / "python"), **cluster)
    return validate(data)


def test_first_attempt_converts_what_another_world_saved(tmp_path):
    job = zero(tmp_path)   # world 2, no min_nodes
    ck = checkpoint(tmp_path, shards=3)
    plan, said, ev, ex = plan_of(job, run_id="r"), Said(), Events(), Counted()
    assert universal.prepare(job, plan, ex, ck, said, ev) is True
    assert said.lines == [f"resume: {ck} was saved at world 3; converted to DeepSpeed's universal "
                          "checkpoint on node0 n0 (ds_to_universal), loaded at world 2 "
                          "(checkpoint.load_universal)"]
    assert ev.seen == [("universal_checkpoint", {"path": ck, "saved_world": 3, "world": 2,
                                                 "converted": True})]
    assert ex.runs == 1 and open(f"{ck}/calls").read() == "converted\n"


def test_same_world_is_one_quick_look_and_no_conversion(tmp_path):
    job, ck = zero(tmp_path), checkpoint(tmp_path, shards=2)
    ex = Counted()
    assert universal.prepare(job, plan_of(job, run_id="r"), ex, ck, Said(), Events()) is False
    assert ex.runs == 1 and not os.path.exists(f"{ck}/calls")
    plain = lora(hosts=2, gpus=1, per_device=1, grad_accum=3) | {"output_dir": str(tmp_path / "o")}
    job = validate(plain)   # no DeepSpeed: nothing asked at all (executor None would fail)
    assert universal.prepare(job, plan_of(job, run_id="r"), None, ck, Said(), Events()) is False


def test_slurm_looks_on_the_login_node_before_a_slurm_job(tmp_path):
    """Under Slurm the conversion is a one-node job of its own: at the same world the look on
    the login node (where output_dir is shared) is all; at another world the job runs."""
    from .test_slurm_exclude import _lora
    python = zero(tmp_path).cluster.python   # the stand-in converter
    data = _lora(nodes=2, min_nodes=None) | {"deepspeed": {"stage": 2}, "output_dir": str(tmp_path / "o")}
    data["cluster"]["python"] = python
    job = validate(data)   # 2 nodes × 2: world 4
    plan = plan_of(job, run_id="r")
    ex = Counted()
    assert universal.prepare(job, plan, ex, checkpoint(tmp_path, shards=4), Said(), Events()) is False
    assert (ex.runs, ex.steps) == (1, 0)
    shutil.rmtree(tmp_path / "out")
    ck, said, ex = checkpoint(tmp_path, shards=6), Said(), Counted()
    assert universal.prepare(job, plan, ex, ck, said, Events()) is True
    assert (ex.runs, ex.steps) == (1, 1)
    assert said.lines == [f"resume: {ck} was saved at world 6; converted to DeepSpeed's universal "
                          "checkpoint on a one-node Slurm job (srun) (ds_to_universal), loaded at "
                          "world 4 (checkpoint.load_universal)"]


def test_a_form_unverified_at_another_world_is_refused_never_converted(tmp_path):
    """The shrink rule's refusal (spec/spare_rules.py: NVMe offload) holds for a resume at
    another world too, said before anything converts; at the saved world it resumes."""
    nvme = {"stage": 2, "offload_optimizer": "nvme", "nvme_path": str(tmp_path)}
    job = zero(tmp_path, deepspeed=nvme)
    plan, ck = plan_of(job, run_id="r"), checkpoint(tmp_path, shards=3)
    with pytest.raises(UserError) as err:
        universal.prepare(job, plan, Counted(), ck, Said(), Events())
    assert err.value.lines() == [
        f"--resume {ck}: saved at world 3, this run's world is 2: mlaunch converts a ZeRO "
        "checkpoint to another world (ds_to_universal) only in the forms verified for a shrink "
        "(deepspeed.stage 1, 2 or 3 with offload to cpu or none), not with offload_optimizer to "
        "nvme; resume at world 3 (the hosts and gpus_per_node that saved it)"]
    assert not os.path.exists(f"{ck}/calls") and not os.path.exists(f"{ck}/latest_universal")
    shutil.rmtree(tmp_path / "out")
    ck = checkpoint(tmp_path, shards=2)
    assert universal.prepare(job, plan, Counted(), ck, Said(), Events()) is False


class Found(Master):
    """output_dir's helper whose latest complete checkpoint is still the resumed one."""

    def __init__(self, ck):
        self.ck = ck

    def discover(self):
        from types import SimpleNamespace
        return SimpleNamespace(latest=self.ck, progress={})


def test_submit_converts_before_attempt_0_and_a_restart_loads_it_again(tmp_path, monkeypatch):
    """The attempt loop: the conversion comes before attempt 0 starts, and attempt 0's
    ds_config has checkpoint.load_universal; attempt 0 fails before it saves anything, so the
    restart resumes the same checkpoint (no min_nodes, no shrink) and loads it the same way."""
    job = zero(tmp_path).model_copy(update={"max_restarts": 1, "restart_backoff_s": 0})
    ck = checkpoint(tmp_path, shards=3)
    plans = []
    backend = fails_once(plans)
    logs = str(tmp_path / "logs")
    plan = plan_of(job, run_id="r", log_dir=logs)
    said = Said()
    code = attempts._attempts(plan, ShellExecutor(), said, SubmitOptions(log_dir=logs, resume="latest"),
                              Found(ck), ck, Rec(), backend)
    assert code == 0 and len(plans) == 2
    for p in plans:
        ds = next(f for f in p.files if f.path.endswith("ds_config.json"))
        assert json.loads(ds.content)["checkpoint"] == {"load_universal": True}
    events = read_events(os.path.join(plan.log_dir, "events.jsonl"))
    assert [(e["event"], e["attempt"], e.get("converted")) for e in events
            if e["event"] in ("run_start", "universal_checkpoint", "restart", "run_end")] == [
        ("run_start", 0, None), ("universal_checkpoint", 0, True), ("universal_checkpoint", 1, False),
        ("restart", 1, None), ("run_end", 1, None)]
    assert said.lines[0].startswith(f"resume: {ck} was saved at world 3; converted"), said.lines
    assert open(f"{ck}/calls").read() == "converted\n"


@pytest.mark.training
@pytest.mark.parametrize("saved,world", [(2, 1), (1, 2)])
def test_zero2_saved_at_one_world_resumes_at_another(tmp_path, saved, world):
    """LLaMA-Factory full fine-tuning, ZeRO-2, on localhost: 16 steps (one epoch) at world
    `saved` (global batch 4: per device 2 × grad_accum 2 / saved), a checkpoint every 4 steps;
    checkpoint-4, alone in another output_dir, resumed with `submit --resume latest` at `world`
    (the same global batch, the same 4 samples a step). The checkpoint is complete at either
    world (a smaller world's shards are all its ranks'); it converts before attempt 0, which
    reaches step 16. Each of its 12 steps has the uninterrupted run's loss within 0.5 %
    (measured: equal to the 4 decimals logged), and its last checkpoint holds Adam's step 16
    on every rank and moments whose norms, over all shards, are the uninterrupted run's
    within 2 %."""
    from .helpers import mlaunch, write_spec
    from .training import adam_moments, build_tiny, lf_spec, logged, submit_timed
    tiny = build_tiny(str(tmp_path / "tiny"))
    whole, resumed = str(tmp_path / "whole"), str(tmp_path / "resumed")
    spec = lf_spec(tiny, ["localhost"], saved, whole, finetuning={"type": "full"},
                   deepspeed={"stage": 2}, max_steps=16, save_steps=4)
    spec["batch"]["grad_accum"] = 2 // saved
    r = submit_timed(tmp_path, spec)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    reference = dict(logged(whole))
    os.makedirs(resumed)
    shutil.copytree(os.path.join(whole, "checkpoint-4"), os.path.join(resumed, "checkpoint-4"))
    spec = lf_spec(tiny, ["localhost"], world, resumed, finetuning={"type": "full"},
                   deepspeed={"stage": 2}, max_steps=16, save_steps=4)
    spec["batch"]["grad_accum"] = 2 // world
    r = mlaunch("submit", write_spec(tmp_path, spec, "resume.yaml"), "--no-preflight",
                "--resume", "latest", timeout=600)
    console = r.stdout + r.stderr
    assert r.returncode == 0, console[-4000:]
    ck = os.path.join(resumed, "checkpoint-4")
    line = (f"resume: {ck} was saved at world {saved}; converted to DeepSpeed's universal checkpoint "
            f"on node0 localhost (ds_to_universal), loaded at world {world} (checkpoint.load_universal)")
    assert line in console, console[-4000:]
    assert console.index(line) < console.index("[node0 localhost"), console[-4000:]
    (path,) = glob.glob(os.path.join(resumed, "logs", "*", "events.jsonl"))
    events = read_events(path)
    (conv,) = [e for e in events if e["event"] == "universal_checkpoint"]
    assert (conv["attempt"], conv["saved_world"], conv["world"], conv["converted"]) == (0, saved, world, True)
    assert events[-1]["event"] == "run_end" and (events[-1]["code"], events[-1]["attempts"]) == (0, 1)
    after = dict(logged(resumed))   # only the resumed run's steps: its trainer_log starts there
    steps = sorted(s for s in after if s > 4)
    assert steps == list(range(5, 17)), logged(resumed)
    for s in steps:
        print(f"step {s}: world {saved} uninterrupted {reference[s]:.4f}, resumed at world {world} "
              f"{after[s]:.4f} ({(after[s] - reference[s]) / reference[s]:+.2%})")
    for s in steps:
        assert after[s] == pytest.approx(reference[s], rel=0.005), (s, after, reference)
    got, want = (adam_moments(os.path.join(d, "checkpoint-16")) for d in (resumed, whole))
    assert len(got) == world and all(v["steps"] == [16] for v in got.values()), got
    for key in ("exp_avg", "exp_avg_sq"):   # the shards differ by world: their norms combined
        combined = [math.sqrt(sum(v[key] ** 2 for v in m.values())) for m in (got, want)]
        assert combined[0] == pytest.approx(combined[1], rel=0.02), (key, got, want)


def test_a_restart_after_a_resume_with_nothing_newer_resumes_the_same_checkpoint(tmp_path):
    """--resume=PATH (a rollback, or a checkpoint outside output_dir), then a failure before the
    first new save: the restart resumes PATH again. It used to find nothing newer complete in
    output_dir and start fresh from step 0 (or take output_dir's own newer checkpoint)."""
    job = validate(lora(hosts=2, gpus=1, per_device=1, grad_accum=3) | {
        "output_dir": str(tmp_path / "out"), "max_restarts": 1, "restart_backoff_s": 0})
    ck = str(tmp_path / "elsewhere" / "checkpoint-7")
    plans = []
    backend = fails_once(plans)
    logs = str(tmp_path / "logs")
    plan = plan_of(job, run_id="r", log_dir=logs, resume_from=ck)
    code = attempts._attempts(plan, ShellExecutor(), Said(), SubmitOptions(log_dir=logs, resume=ck),
                              Found(None), ck, Rec(), backend)
    assert code == 0 and [p.resume_from for p in plans] == [ck, ck]
    events = read_events(os.path.join(plan.log_dir, "events.jsonl"))
    assert [e.get("resume_from") for e in events if e["event"] == "restart"] == [ck]
    assert attempts.named_resume(SubmitOptions(resume=ck))
    assert not any(attempts.named_resume(SubmitOptions(resume=r)) for r in (None, "latest", "auto"))


@pytest.mark.training
def test_a_failure_before_the_first_save_after_resume_path_resumes_it_again_on_the_same_curve(tmp_path):
    """LLaMA-Factory LoRA on localhost, world 2: `--resume=PATH` of checkpoint-4 copied outside
    output_dir, then rank 0 ends right after step 6, before the run's first save (step 10). The
    restart resumes PATH again (before, it found nothing complete in output_dir and trained
    from step 0), and attempt 1's steps 5-12 have the uninterrupted run's losses within 0.5 %."""
    from .helpers import mlaunch, write_spec
    from .training import build_tiny, by_attempt, exits_at, lf_spec, logged, submit_timed
    tiny = build_tiny(str(tmp_path / "tiny"))
    whole, out = str(tmp_path / "whole"), str(tmp_path / "out")
    r = submit_timed(tmp_path, lf_spec(tiny, ["localhost"], 2, whole, max_steps=12, save_steps=4))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    reference = dict(logged(whole))
    ck = str(tmp_path / "elsewhere" / "checkpoint-4")
    shutil.copytree(os.path.join(whole, "checkpoint-4"), ck)
    spec = exits_at(lf_spec(tiny, ["localhost"], 2, out, max_steps=12, save_steps=10, max_restarts=1,
                            restart_backoff_s=0), 6, str(tmp_path / "hold"))
    r = mlaunch("submit", write_spec(tmp_path, spec, "again.yaml"), "--no-preflight", f"--resume={ck}",
                timeout=600)
    console = r.stdout + r.stderr
    assert r.returncode == 0, console[-4000:]
    assert f"restart 1/1: resuming from {ck}" in console, console[-4000:]
    cut, after = by_attempt(logged(out), resumed=4)
    assert sorted(cut) == [5, 6] and sorted(after) == list(range(5, 13)), logged(out)
    for s in sorted(after):
        print(f"step {s}: uninterrupted {reference[s]:.4f}, resumed {ck} again {after[s]:.4f}")
        assert after[s] == pytest.approx(reference[s], rel=0.005), (s, after, reference)
    # torchrun's own copy of the ranks' output: gone after the clean run (every line is in its
    # node log); kept after the restarted one, the failed attempt's beside the one that ended well
    assert _torchrun_copies(whole) == []
    assert len(_torchrun_copies(out)) == 2, _torchrun_copies(out)


def _torchrun_copies(out: str) -> list[str]:
    """The torchrun run folders (one per attempt) left in node 0's --log-dir of the run in out."""
    import glob
    run_id = os.path.basename(os.path.dirname(glob.glob(os.path.join(out, "logs", "*", "events.jsonl"))[0]))
    return glob.glob(f"/tmp/mlaunch-*/.mlaunch/{run_id}/torchrun/node0/*")

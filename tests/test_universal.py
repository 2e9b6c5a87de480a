"""ZeRO shrink (issue 29): node 0's conversion to DeepSpeed's universal checkpoint
(templates/universal.sh.j2 run by launch/universal.py) and the ds_config that loads it. The
conversion runs here in a real shell against checkpoint directories laid out as the HF Trainer
writes them, with a stand-in `python -m deepspeed.checkpoint.ds_to_universal` (the real one runs
in tests/test_spares_training.py's 4 -> 3 node ZeRO-2 run)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from launcher.errors import UserError
from launcher.runs import universal
from launcher.plan.launch_plan import build_plan
from launcher.spec import validate

from .test_shrink import lora
from .test_spares import Events, Said

# What ds_to_universal leaves (its last step writes latest_universal beside the tag folder).
FAKE_CONVERTER = """#!/bin/sh
[ -n "$FAIL" ] && { echo "AssertionError: $FAIL"; exit 1; }
while [ $# -gt 0 ]; do case $1 in --output_folder) out=$2 ;; esac; shift; done
mkdir -p "$out/zero/lm_head.weight" && touch "$out/${MODEL_STATES:-mp_rank_00_model_states.pt}"
basename "$out" > "$(dirname "$out")/latest_universal"
echo converted >> "$(dirname "$out")/calls"
"""


def checkpoint(tmp_path, shards: int, ranks: int | None = None) -> str:
    ck = tmp_path / "out" / "checkpoint-3"
    (ck / "global_step3").mkdir(parents=True)
    (ck / "latest").write_text("global_step3")
    (ck / "global_step3" / "mp_rank_00_model_states.pt").write_text("")
    for r in range(shards):
        (ck / "global_step3" / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt").write_text("")
    for r in range(shards if ranks is None else ranks):
        (ck / f"rng_state_{r}.pth").write_text("")
    return str(ck)


class ShellExecutor:
    """Runs node scripts in a local shell (the login is ignored), as SSH would on node 0."""

    def __init__(self, env=None):
        self.env = env or {}

    def run(self, login, script, timeout):
        r = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True,
                           timeout=timeout, env={**os.environ, **self.env})
        return r.returncode, r.stdout + r.stderr


def zero_job(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").write_text(FAKE_CONVERTER)
    (bindir / "python").chmod(0o755)
    data = lora(hosts=3, gpus=1, per_device=2, grad_accum=4, min_nodes=2) | {
        "deepspeed": {"stage": 2}, "output_dir": str(tmp_path / "out")}
    data["cluster"]["python"] = str(bindir / "python")
    return validate(data)


def test_saved_at_another_world_converted_once_and_loaded_universal(tmp_path):
    job = zero_job(tmp_path)   # 3 nodes × 1: world 3, after a shrink from 4
    # Rank 3's node was lost after DeepSpeed's save, before it wrote its rng state (seen in a
    # real ms-swift run): its shard counts, the missing rng state does not.
    ck = checkpoint(tmp_path, shards=4, ranks=3)
    plan = build_plan(job, run_id="r")
    said, ev = Said(), Events()
    assert universal.prepare(job, plan, ShellExecutor(), ck, said, ev) is True
    assert said.lines == [f"resume: {ck} was saved at world 4; converted to DeepSpeed's universal "
                          "checkpoint on node0 n0 (ds_to_universal), loaded at world 3 "
                          "(checkpoint.load_universal)"]
    assert ev.seen == [("universal_checkpoint", {"path": ck, "saved_world": 4, "world": 3,
                                                 "converted": True})]
    assert os.path.exists(f"{ck}/global_step3_universal/.mlaunch-complete")
    said = Said()   # a second restart from the same checkpoint: not converted again
    assert universal.prepare(job, plan, ShellExecutor(), ck, said, Events()) is True
    assert "already converted" in said.lines[0]
    assert open(f"{ck}/calls").read() == "converted\n"
    plan = build_plan(job, run_id="r", resume_from=ck, universal=True)
    ds = next(f for f in plan.files if f.path.endswith("ds_config.json"))
    assert json.loads(ds.content)["checkpoint"] == {"load_universal": True}
    assert json.loads(ds.content)["gradient_accumulation_steps"] == 4
    assert "checkpoint.load_universal: mlaunch" in ds.note
    plain = next(f for f in build_plan(job, run_id="r", resume_from=ck).files
                 if f.path.endswith("ds_config.json"))
    assert "checkpoint" not in json.loads(plain.content)


def test_same_world_needs_nothing_and_failures_end_the_run(tmp_path):
    job = zero_job(tmp_path)
    plan = build_plan(job, run_id="r")
    ck = checkpoint(tmp_path, shards=3)
    assert universal.prepare(job, plan, ShellExecutor(), ck, Said(), Events()) is False
    assert not os.path.exists(f"{ck}/latest_universal")
    assert universal.prepare(job, plan, ShellExecutor(), None, Said(), Events()) is False
    os.rename(f"{ck}/global_step3/zero_pp_rank_2_mp_rank_00_optim_states.pt", f"{ck}/x")
    (tmp_path / "out" / "checkpoint-3" / "rng_state_3.pth").write_text("")   # saved by 4, 2 shards
    with pytest.raises(UserError) as err:
        universal.prepare(job, plan, ShellExecutor(), ck, Said(), Events())
    assert err.value.lines() == [
        f"resume from {ck} at world 3: DeepSpeed's universal checkpoint could not be made on "
        f"node0 n0: {ck}/global_step3 has 2 optimizer shards but 4 ranks saved it; the run ends "
        "(the checkpoint itself is untouched)"]
    os.rename(f"{ck}/global_step3/zero_pp_rank_1_mp_rank_00_optim_states.pt", f"{ck}/y")
    os.rename(f"{ck}/x", f"{ck}/global_step3/zero_pp_rank_2_mp_rank_00_optim_states.pt")
    (tmp_path / "out" / "checkpoint-3" / "global_step3" / "zero_pp_rank_3_mp_rank_00_optim_states.pt").write_text("")
    with pytest.raises(UserError) as err:   # 3 shards of the 4 that saved it: not this world's
        universal.prepare(job, plan, ShellExecutor(), ck, Said(), Events())
    assert f"{ck}/global_step3 has 3 optimizer shards but 4 ranks saved it" in err.value.lines()[0]
    os.rename(f"{ck}/y", f"{ck}/global_step3/zero_pp_rank_1_mp_rank_00_optim_states.pt")
    with pytest.raises(UserError) as err:
        universal.prepare(job, plan, ShellExecutor({"FAIL": "universal_checkpoint_info missing"}),
                          ck, Said(), Events())
    assert "ds_to_universal exited 1: AssertionError: universal_checkpoint_info missing" in err.value.lines()[0]
    assert not os.path.exists(f"{ck}/latest_universal")


def test_dry_run_says_a_zero_checkpoint_goes_through_the_universal_one(tmp_path):
    from launcher.view.present import describe_plan
    text = describe_plan(build_plan(zero_job(tmp_path), run_id="r"))
    assert ("  a ZeRO checkpoint saved at another world is converted once on node 0 "
            "(ds_to_universal) and loaded with checkpoint.load_universal") in text, text


def test_a_braced_ds_config_path_is_quoted_in_the_refusal(tmp_path):
    """The refusal of a shrink with the user's own ds_config names its path as it is."""
    from .test_spares import problems
    cfg = tmp_path / "ds{stage}.json"
    cfg.write_text(json.dumps({"zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path)}}}))
    data = lora(min_nodes=2) | {"deepspeed": {"config": str(cfg)}}
    (line,) = [p for p in problems(data) if p.startswith("cluster.min_nodes")]
    assert f"not with offload_optimizer to nvme in {cfg}; set cluster.min_nodes to the node " \
           "count (3)" in line, line


def test_an_interrupted_conversion_is_never_taken_as_complete(tmp_path):
    """A conversion cut off after ds_to_universal wrote latest_universal but before mlaunch
    checked it leaves no completion mark: the next restart converts again from the untouched
    checkpoint. A converter that exits 0 without finishing ends the run instead."""
    job = zero_job(tmp_path)
    plan = build_plan(job, run_id="r")
    ck = checkpoint(tmp_path, shards=4)
    os.makedirs(f"{ck}/global_step3_universal/zero")
    open(f"{ck}/global_step3_universal/zero/half", "w").close()
    open(f"{ck}/latest_universal", "w").write("global_step3_universal")
    said = Said()
    assert universal.prepare(job, plan, ShellExecutor(), ck, said, Events()) is True
    assert "; converted to DeepSpeed's universal" in said.lines[0], said.lines
    assert open(f"{ck}/calls").read() == "converted\n"
    assert not os.path.exists(f"{ck}/global_step3_universal/zero/half")
    assert sorted(os.listdir(f"{ck}/global_step3")) == sorted(
        ["mp_rank_00_model_states.pt"] + [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
                                          for r in range(4)])   # the user's checkpoint as it was
    os.remove(f"{ck}/global_step3_universal/.mlaunch-complete")
    with open(tmp_path / "bin" / "python", "w") as fh:   # a converter that stops half way
        fh.write("#!/bin/sh\nwhile [ $# -gt 0 ]; do case $1 in --output_folder) out=$2 ;; esac; "
                 "shift; done\nmkdir -p \"$out/zero\"\n")
    with pytest.raises(UserError) as err:
        universal.prepare(job, plan, ShellExecutor(), ck, Said(), Events())
    assert "global_step3_universal is incomplete" in err.value.lines()[0], err.value.lines()
    assert not os.path.exists(f"{ck}/global_step3_universal/.mlaunch-complete")
    assert not os.path.exists(f"{ck}/latest_universal")


def test_a_long_conversion_says_it_is_still_running(tmp_path, monkeypatch):
    """A conversion that outlasts TICK_S prints a line each TICK_S with the time so far, then
    the usual result line; the run itself is the same."""
    monkeypatch.setattr(universal, "TICK_S", 0.01)
    job = zero_job(tmp_path)
    ck = checkpoint(tmp_path, shards=4)
    said = Said()

    class Slow(ShellExecutor):
        def run(self, login, script, timeout):   # returns once two progress lines were said
            for _ in range(100000):
                if len(said.lines) >= 2:
                    break
                __import__("time").sleep(0.001)
            return super().run(login, script, timeout)
    assert universal.prepare(job, build_plan(job, run_id="r"), Slow(), ck, said, Events()) is True
    ticks, last = said.lines[:-1], said.lines[-1]
    assert len(ticks) >= 2 and all(line.startswith(
        f"resume: node0 n0 is still checking {ck} or converting it to DeepSpeed's universal "
        "checkpoint (ds_to_universal rewrites every optimizer state): ") and line.endswith(" s so far")
        for line in ticks), said.lines
    assert last.startswith(f"resume: {ck} was saved at world 4; converted")


def test_a_zero3_conversion_is_complete_with_rank_0s_model_states(tmp_path):
    """ZeRO-3's universal checkpoint keeps a model-states file per rank (DeepSpeed loads rank
    0's): complete with zero_pp_rank_0_mp_rank_00_model_states.pt, incomplete with neither."""
    job = zero_job(tmp_path)
    ck = checkpoint(tmp_path, shards=4)
    plan = build_plan(job, run_id="r")
    zero3 = ShellExecutor({"MODEL_STATES": "zero_pp_rank_0_mp_rank_00_model_states.pt"})
    assert universal.prepare(job, plan, zero3, ck, Said(), Events()) is True
    assert os.path.exists(f"{ck}/global_step3_universal/.mlaunch-complete")
    ck2 = checkpoint(tmp_path / "again", shards=4)
    with pytest.raises(UserError) as err:
        universal.prepare(job, plan, ShellExecutor({"MODEL_STATES": "other.pt"}), ck2, Said(), Events())
    assert "is incomplete (latest_universal, model states, zero/)" in str(err.value)


def test_a_checkpoint_saved_again_after_its_conversion_is_converted_again(tmp_path):
    """A later run that saves checkpoint-N into the same folder (--overwrite, the same step)
    leaves the earlier run's conversion beside it: it is another run's weights, and the next
    restart converts the new save instead of loading the old one."""
    job = zero_job(tmp_path)
    plan = build_plan(job, run_id="r")
    ck = checkpoint(tmp_path, shards=4)
    assert universal.prepare(job, plan, ShellExecutor(), ck, Said(), Events()) is True
    assert open(f"{ck}/calls").read() == "converted\n"
    shard = f"{ck}/global_step3/zero_pp_rank_0_mp_rank_00_optim_states.pt"
    with open(shard, "w") as fh:   # the new run's save: other bytes, a later time
        fh.write("the new run's optimizer state")
    os.utime(shard, (os.path.getatime(shard), os.path.getmtime(shard) + 5))
    said = Said()
    assert universal.prepare(job, plan, ShellExecutor(), ck, said, Events()) is True
    assert "; converted to DeepSpeed's universal" in said.lines[0], said.lines
    assert open(f"{ck}/calls").read() == "converted\nconverted\n"
    assert universal.prepare(job, plan, ShellExecutor(), ck, Said(), Events()) is True   # and once only
    assert open(f"{ck}/calls").read() == "converted\nconverted\n"

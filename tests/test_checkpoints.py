"""Tests for launcher.nodeprog.checkpoints against real directory trees."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.nodeprog import source
from launcher.nodeprog.checkpoints import Discovery, Skipped, find_latest_complete, has_checkpoints

from .loadfactor import limit

SOURCE = source("checkpoints")   # the text the launcher ships: ckpt_checks.py inlined


def make_ckpt(root, name, step=None, state=True, weights=("model.safetensors",),
              state_text=None):
    """Create a checkpoint dir like HF Trainer writes; returns its Path."""
    d = Path(root) / name
    d.mkdir(parents=True)
    for w in weights:
        (d / w).write_bytes(b"\0" * 8)
    if state_text is not None:
        (d / "trainer_state.json").write_text(state_text)
    elif state:
        step = int(name.rsplit("-", 1)[1]) if step is None else step
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    return d


def make_ds(ckpt, step, optim_ranks=1, model_states=True, latest=True):
    """Add a DeepSpeed global_step<N>/ dir with optimizer shards per rank."""
    g = Path(ckpt) / ("global_step%d" % step)
    g.mkdir()
    if model_states:
        (g / "mp_rank_00_model_states.pt").write_bytes(b"x")
    for r in range(optim_ranks):
        (g / ("bf16_zero_pp_rank_%d_mp_rank_00_optim_states.pt" % r)).write_bytes(b"x")
    if latest:
        (Path(ckpt) / "latest").write_text("global_step%d" % step)


def snapshot(root):
    """Every path under root with its size and mtime, to prove nothing changed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns)
    return out


def test_complete_plain_checkpoint(tmp_path):
    make_ckpt(tmp_path, "checkpoint-10")
    d = find_latest_complete(str(tmp_path))
    assert d == Discovery(str(tmp_path / "checkpoint-10"), 10, (), True)
    assert d.explain() == []
    assert has_checkpoints(str(tmp_path))


def test_lora_adapter_counts_as_weights(tmp_path):
    make_ckpt(tmp_path, "checkpoint-5", weights=("adapter_model.safetensors", "adapter_config.json"))
    make_ckpt(tmp_path, "checkpoint-6", weights=("adapter_model.bin",))
    d = find_latest_complete(str(tmp_path))
    assert (d.latest, d.step) == (str(tmp_path / "checkpoint-6"), 6)


def test_half_written_newer_checkpoint_skipped(tmp_path):
    make_ckpt(tmp_path, "checkpoint-10")
    make_ckpt(tmp_path, "checkpoint-20")
    make_ckpt(tmp_path, "checkpoint-30", state=False)
    d = find_latest_complete(str(tmp_path))
    assert d.latest == str(tmp_path / "checkpoint-20") and d.step == 20
    assert d.skipped == (Skipped(str(tmp_path / "checkpoint-30"), "checkpoint-30",
                                 "no trainer_state.json (interrupted save?)"),)
    assert d.explain() == ["checkpoint-30: no trainer_state.json (interrupted save?) — using checkpoint-20"]


def test_corrupt_trainer_state(tmp_path):
    make_ckpt(tmp_path, "checkpoint-20", state_text='{"global_step": 2')
    d = find_latest_complete(str(tmp_path))
    assert d.latest is None and d.step is None and d.found_any
    assert d.skipped[0].reason.startswith("trainer_state.json is not valid JSON: ")
    assert d.explain()[0].endswith(" — no complete checkpoint")


def test_global_step_mismatch(tmp_path):
    make_ckpt(tmp_path, "checkpoint-20")
    make_ckpt(tmp_path, "checkpoint-30", step=25)
    d = find_latest_complete(str(tmp_path))
    assert d.step == 20
    assert d.skipped[0].reason == "trainer_state.json says global_step 25, expected 30"


def test_trainer_state_without_global_step(tmp_path):
    make_ckpt(tmp_path, "checkpoint-3", state_text="[1, 2]")
    assert find_latest_complete(str(tmp_path)).skipped[0].reason == \
        "trainer_state.json has no integer global_step"


def test_missing_weights(tmp_path):
    make_ckpt(tmp_path, "checkpoint-20")
    make_ckpt(tmp_path, "checkpoint-30", weights=("config.json",))
    d = find_latest_complete(str(tmp_path))
    assert d.step == 20
    assert d.skipped[0].reason == "no model or adapter weights"


def _sharded(root, name, present):
    d = make_ckpt(root, name, weights=present)
    index = {"metadata": {}, "weight_map": {
        "a.weight": "model-00001-of-00002.safetensors",
        "b.weight": "model-00002-of-00002.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d


def test_sharded_index_complete_and_missing_shard(tmp_path):
    _sharded(tmp_path, "checkpoint-20", ("model-00001-of-00002.safetensors",
                                         "model-00002-of-00002.safetensors"))
    _sharded(tmp_path, "checkpoint-30", ("model-00001-of-00002.safetensors",))
    d = find_latest_complete(str(tmp_path))
    assert d.step == 20
    assert d.skipped[0].reason == \
        "shard model-00002-of-00002.safetensors listed in the index is missing"


def test_deepspeed_too_few_optimizer_shards(tmp_path):
    """Two ranks saved checkpoint-30 (their rng states say so) and one shard is there: not
    complete, whatever this world is."""
    c20 = make_ckpt(tmp_path, "checkpoint-20")
    make_ds(c20, 20, optim_ranks=2)
    c30 = make_ckpt(tmp_path, "checkpoint-30")
    make_ds(c30, 30, optim_ranks=1)
    for r in range(2):
        (c30 / f"rng_state_{r}.pth").write_bytes(b"x")
    for dp in (2, 1, None):
        d = find_latest_complete(str(tmp_path), deepspeed=True, dp_size=dp)
        assert d.step == 20, dp
        assert d.skipped[0].reason == ("DeepSpeed global_step30/ has 1 optimizer shard, "
                                       "expected 2 (one per data-parallel rank)")
    # Without --deepspeed the dir is not checked.
    assert find_latest_complete(str(tmp_path)).step == 30


def test_deepspeed_checkpoint_of_a_smaller_world_is_complete_a_gap_is_not(tmp_path):
    """Saved by 2 ranks (2 shards, 2 rng states), resumed at world 4: complete (the resume
    converts it to the universal checkpoint); shards 0 and 2 of 3 ranks: a gap, incomplete.
    Without rank numbers (no shard or rng state names one) this world's size is the need."""
    c10 = make_ckpt(tmp_path, "checkpoint-10")
    make_ds(c10, 10, optim_ranks=2)
    for r in range(2):
        (c10 / f"rng_state_{r}.pth").write_bytes(b"x")
    assert find_latest_complete(str(tmp_path), deepspeed=True, dp_size=4).step == 10
    c20 = make_ckpt(tmp_path, "checkpoint-20")
    make_ds(c20, 20, optim_ranks=3)
    os.remove(c20 / "global_step20" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt")
    d = find_latest_complete(str(tmp_path), deepspeed=True, dp_size=4)
    assert d.step == 10 and d.skipped[0].reason == (
        "DeepSpeed global_step20/ has 2 optimizer shards, expected 3 (one per data-parallel rank)")
    c30 = make_ckpt(tmp_path, "checkpoint-30")
    make_ds(c30, 30, optim_ranks=0)
    (c30 / "global_step30" / "optim_states.pt").write_bytes(b"x")   # no rank in its name
    d = find_latest_complete(str(tmp_path), deepspeed=True, dp_size=2)
    assert d.step == 10 and d.skipped[0].reason.startswith("DeepSpeed global_step30/ has 1 optimizer shard, expected 2")


def test_deepspeed_enough_shards_zero3_without_weights(tmp_path):
    # ZeRO-3 without gathered 16-bit weights: no model.safetensors, states only.
    c = make_ckpt(tmp_path, "checkpoint-40", weights=())
    g = c / "global_step40"
    g.mkdir()
    for r in range(2):
        (g / ("zero_pp_rank_%d_mp_rank_00_model_states.pt" % r)).write_bytes(b"x")
        (g / ("bf16_zero_pp_rank_%d_mp_rank_00_optim_states.pt" % r)).write_bytes(b"x")
    (c / "latest").write_text("global_step40\n")
    d = find_latest_complete(str(tmp_path), deepspeed=True, dp_size=2)
    assert (d.latest, d.step, d.skipped) == (str(c), 40, ())
    # Without DeepSpeed mode the same checkpoint lacks weights.
    assert find_latest_complete(str(tmp_path)).skipped[0].reason == "no model or adapter weights"


def test_deepspeed_missing_dir_model_states_and_wrong_latest(tmp_path):
    make_ckpt(tmp_path, "checkpoint-10")
    make_ds(make_ckpt(tmp_path, "checkpoint-20"), 20, model_states=False)
    c30 = make_ckpt(tmp_path, "checkpoint-30")
    make_ds(c30, 30)
    (c30 / "latest").write_text("global_step29")
    make_ckpt(tmp_path, "checkpoint-40")
    d = find_latest_complete(str(tmp_path), deepspeed=True)
    assert d.latest is None
    assert [s.reason for s in d.skipped] == [
        "no DeepSpeed global_step40/ directory",
        "DeepSpeed latest file names 'global_step29', expected 'global_step30'",
        "DeepSpeed global_step20/ has no model states (*model_states.pt)",
        "no DeepSpeed global_step10/ directory",
    ]


def test_swift_version_dirs(tmp_path):
    make_ckpt(tmp_path, "v0-20260101-100000/checkpoint-50")
    make_ckpt(tmp_path, "v1-20260102-100000/checkpoint-40")
    make_ckpt(tmp_path, "v1-20260102-100000/checkpoint-60", state=False)
    make_ckpt(tmp_path, "notes/checkpoint-90")  # not a version dir: ignored
    d = find_latest_complete(str(tmp_path))
    assert d.latest == str(tmp_path / "v0-20260101-100000" / "checkpoint-50")
    assert d.skipped[0].name == "v1-20260102-100000/checkpoint-60"
    assert d.explain() == ["v1-20260102-100000/checkpoint-60: no trainer_state.json "
                           "(interrupted save?) — using v0-20260101-100000/checkpoint-50"]


def test_swift_tie_prefers_newer_version(tmp_path):
    make_ckpt(tmp_path, "v2-20260103-000000/checkpoint-10")
    make_ckpt(tmp_path, "v10-20260104-000000/checkpoint-10")
    make_ckpt(tmp_path, "checkpoint-10")
    d = find_latest_complete(str(tmp_path))
    assert d.latest == str(tmp_path / "v10-20260104-000000" / "checkpoint-10")


def test_numeric_ordering(tmp_path):
    for n in (20, 100, 9):
        make_ckpt(tmp_path, "checkpoint-%d" % n)
    (tmp_path / "checkpoint-final").mkdir()
    (tmp_path / "checkpoint-200").write_text("a file, not a dir")
    assert find_latest_complete(str(tmp_path)).step == 100


def test_nothing_deleted_or_modified(tmp_path):
    make_ckpt(tmp_path, "checkpoint-20")
    make_ckpt(tmp_path, "checkpoint-30", state=False)
    make_ckpt(tmp_path, "checkpoint-40", state_text="{bad")
    make_ds(make_ckpt(tmp_path, "checkpoint-50"), 50)
    _sharded(tmp_path, "v1-x/checkpoint-60", ())
    before = snapshot(tmp_path)
    find_latest_complete(str(tmp_path))
    find_latest_complete(str(tmp_path), deepspeed=True, dp_size=4)
    has_checkpoints(str(tmp_path))
    assert snapshot(tmp_path) == before


def test_symlink_outside_output_dir_not_followed(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    make_ckpt(out, "checkpoint-10")
    target = make_ckpt(elsewhere, "checkpoint-99")
    os.symlink(target, out / "checkpoint-99")
    os.symlink(out / "checkpoint-10", out / "checkpoint-11")  # inside: followed, but step 10
    d = find_latest_complete(str(out))
    assert d.step == 10 and d.latest == str(out / "checkpoint-10")
    assert "outside output_dir" in d.skipped[0].reason
    assert d.skipped[1].reason == "trainer_state.json says global_step 10, expected 11"


def test_missing_output_dir(tmp_path):
    missing = str(tmp_path / "nope")
    d = find_latest_complete(missing, deepspeed=True, dp_size=2)
    assert d == Discovery(None, None, (), False)
    assert not has_checkpoints(missing)


def test_empty_output_dir_has_no_checkpoints(tmp_path):
    (tmp_path / "runs").mkdir()
    assert not has_checkpoints(str(tmp_path))
    make_ckpt(tmp_path, "checkpoint-1", state=False)
    assert has_checkpoints(str(tmp_path))
    assert find_latest_complete(str(tmp_path)).found_any


def test_json_round_trip(tmp_path):
    make_ckpt(tmp_path, "checkpoint-20")
    make_ckpt(tmp_path, "checkpoint-30", state=False)
    d = find_latest_complete(str(tmp_path))
    assert Discovery.from_json(d.to_json()) == d


def run_script(*args):
    """Run the module source via `python -` on stdin, as the launcher does remotely."""
    proc = subprocess.run([sys.executable, "-", *args], input=SOURCE,
                          capture_output=True, text=True, timeout=limit(60), cwd="/")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_script_mode_matches_in_process(tmp_path):
    c20 = make_ckpt(tmp_path, "checkpoint-20")
    make_ds(c20, 20, optim_ranks=2)
    c30 = make_ckpt(tmp_path, "checkpoint-30")
    make_ds(c30, 30, optim_ranks=1)
    (c30 / "rng_state_1.pth").write_bytes(b"x")   # saved by 2 ranks, rank 1's shard missing
    make_ckpt(tmp_path, "checkpoint-40", state=False)
    out = run_script(str(tmp_path), "--deepspeed", "--dp-size", "2")
    expected = find_latest_complete(str(tmp_path), deepspeed=True, dp_size=2)
    assert out == json.loads(expected.to_json())
    assert Discovery.from_json(json.dumps(out)) == expected
    assert out["latest"] == str(c20) and out["step"] == 20 and len(out["skipped"]) == 2


@pytest.mark.parametrize("setup", ["missing", "incomplete"])
def test_script_mode_exit_zero_when_none_complete(tmp_path, setup):
    if setup == "incomplete":
        make_ckpt(tmp_path, "checkpoint-5", state=False)
    target = str(tmp_path / "nope") if setup == "missing" else str(tmp_path)
    out = run_script(target)
    assert out["latest"] is None and out["step"] is None
    assert out["found_any"] == (setup == "incomplete")


def test_ignore_checkpoints_of_an_earlier_run(tmp_path):
    """After --overwrite a restart must not resume from the older run's higher checkpoint."""
    make_ckpt(tmp_path, "checkpoint-100", 100)
    before = find_latest_complete(str(tmp_path))
    assert before.latest.endswith("checkpoint-100") and len(before.stamps) == 1
    make_ckpt(tmp_path, "checkpoint-5", 5)   # what the fresh run wrote since
    got = find_latest_complete(str(tmp_path), ignore=frozenset(before.stamps))
    assert got.latest == str(tmp_path / "checkpoint-5") and got.skipped == ()
    assert len(got.stamps) == 2


def test_ignore_does_not_hide_a_resaved_checkpoint(tmp_path):
    make_ckpt(tmp_path, "checkpoint-5", 5)
    before = find_latest_complete(str(tmp_path))
    state = tmp_path / "checkpoint-5" / "trainer_state.json"
    os.utime(state, ns=(state.stat().st_atime_ns, state.stat().st_mtime_ns + 10**9))  # saved again
    assert find_latest_complete(str(tmp_path), ignore=frozenset(before.stamps)).step == 5


def test_ignore_json_through_the_script_mode(tmp_path):
    make_ckpt(tmp_path, "checkpoint-100", 100)
    before = find_latest_complete(str(tmp_path))
    make_ckpt(tmp_path, "checkpoint-5", 5)
    got = Discovery.from_json(json.dumps(run_script(str(tmp_path), "--ignore-json",
                                                    json.dumps(list(before.stamps)))))
    assert got.step == 5 and len(got.stamps) == 2


# Megatron-SWIFT's save, as ms-swift 4.6.0 writes it (installed swift venv, site-packages):
#   swift/megatron/trainers/base.py:833       output_dir = <args.output_dir = v<N>-<ts>>/checkpoint-<iteration>
#   swift/megatron/trainers/base.py:836       args.json copied into it
#   swift/megatron/trainers/base.py:837-840   save_safetensors and no_save_optim -> no models given to the mcore save
#   swift/megatron/utils/megatron_lm_utils.py:318      iter_<iteration:07d>/ inside checkpoint-<iteration>
#   swift/megatron/utils/megatron_lm_utils.py:339-345  no models: common.pt only (torch.save)
#   swift/megatron/utils/megatron_lm_utils.py:360      else dist_checkpointing.save: shards, common.pt, metadata.json
#   swift/megatron/utils/megatron_lm_utils.py:372-382  barrier, then the master writes
#                                                      checkpoint-<iteration>/latest_checkpointed_iteration.txt
#   swift/megatron/trainers/base.py:860-873   HF safetensors (adapter or full weights) beside iter_*/
#   swift/megatron/trainers/base.py:875-888   merge_lora: checkpoint-<iteration>-merged/ with tracker and common.pt
#   swift/megatron/trainers/base.py:902       v<N>-<ts>/last-checkpoint symlink to the finished checkpoint
def plant_megatron(root, vdir, iteration, *, lora=True, no_save_optim=False, done=True,
                   merged=False):
    """One Megatron-SWIFT save laid out exactly as the code above writes it (done=False: killed
    after the shards, before metadata.json and the tracker)."""
    ckpt = Path(root) / vdir / f"checkpoint-{iteration}"
    it = ckpt / ("iter_%07d" % iteration)
    it.mkdir(parents=True)
    (ckpt / "args.json").write_text("{}")
    (it / "common.pt").write_bytes(b"x")
    if not no_save_optim:
        for shard in ("__0_0.distcp", "__1_0.distcp", ".metadata"):
            (it / shard).write_bytes(b"x")
        if done:
            (it / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    if not done:
        return ckpt
    (ckpt / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    for f in (("adapter_model.safetensors", "adapter_config.json") if lora
              else ("model.safetensors", "config.json")):
        (ckpt / f).write_bytes(b"x")
    if merged:
        m = Path(root) / vdir / f"checkpoint-{iteration}-merged"
        (m / ("iter_%07d" % iteration)).mkdir(parents=True)
        (m / ("iter_%07d" % iteration) / "common.pt").write_bytes(b"x")
        (m / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    link = Path(root) / vdir / "last-checkpoint"
    if link.is_symlink():
        link.unlink()
    link.symlink_to(ckpt.name)
    return ckpt


def test_megatron_checkpoint_dir_is_the_resume_point(tmp_path):
    v0 = "v0-20260101-000000"
    plant_megatron(tmp_path, v0, 100)
    plant_megatron(tmp_path, v0, 200, merged=True)
    got = find_latest_complete(str(tmp_path), megatron=True)
    assert (got.latest, got.step) == (str(tmp_path / v0 / "checkpoint-200"), 200)
    assert got.skipped == () and has_checkpoints(str(tmp_path))


def test_megatron_interrupted_save_falls_back_to_older_run(tmp_path):
    plant_megatron(tmp_path, "v0-20260101-000000", 100, lora=False)
    # The resumed run was killed while saving 300: shards written, no metadata.json, no tracker.
    plant_megatron(tmp_path, "v1-20260102-000000", 300, lora=False, done=False)
    got = find_latest_complete(str(tmp_path), megatron=True)
    assert got.step == 100 and got.latest == str(tmp_path / "v0-20260101-000000" / "checkpoint-100")
    assert got.explain() == ["v1-20260102-000000/checkpoint-300: no readable "
                             "latest_checkpointed_iteration.txt naming 300 (interrupted save?) — "
                             "using v0-20260101-000000/checkpoint-100"]


def test_megatron_no_save_optim_is_not_resumable(tmp_path):
    plant_megatron(tmp_path, "v0-20260101-000000", 50, no_save_optim=True)
    got = find_latest_complete(str(tmp_path), megatron=True)
    assert got.latest is None and got.found_any
    assert got.explain() == ["v0-20260101-000000/checkpoint-50: iter_0000050/ holds only common.pt: "
                             "saved with no_save_optim, not resumable — no complete checkpoint"]


def test_megatron_tracker_without_metadata_is_skipped(tmp_path):
    ckpt = plant_megatron(tmp_path, "v0-20260101-000000", 50)
    (ckpt / "iter_0000050" / "metadata.json").unlink()
    got = find_latest_complete(str(tmp_path), megatron=True)
    assert got.latest is None
    assert got.skipped[0].reason == "iter_0000050/ lacks metadata.json (interrupted save?)"


def test_megatron_mode_through_the_script(tmp_path):
    plant_megatron(tmp_path, "v0-20260101-000000", 10)
    assert Discovery.from_json(json.dumps(run_script(str(tmp_path), "--megatron"))).step == 10

"""Real DeepSpeed runs through `mlaunch submit`: 2 namespace hosts x 1 process (x 2 for the user ds_config test), CPU, gloo.

The rendered ds_config states no optimizer: the Trainer builds its own, so LoRA+ keeps its
two learning rates, a weight decay / beta2 of the user's choice trains (transformers'
mismatch check has nothing to compare), and ms-swift, which builds its own optimizer too,
trains under ZeRO-2 and ZeRO-3 with its defaults (weight_decay 0.1, adam_beta2 0.95).
"""
from __future__ import annotations

import glob
import json
import os
import subprocess

import pytest

from .loadfactor import limit
from .test_swift_training import assert_trained as swift_trained
from .test_swift_training import checkpoint as swift_checkpoint
from .test_swift_training import swift_spec
from .test_training import assert_outputs, assert_trained
from .training import (SWIFT_PYTHON, TRAINER_PYTHON, build_tiny, lf_spec, require_swift,
                       require_trainer, submit_timed)

pytestmark = [pytest.mark.multihost, pytest.mark.training]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    require_trainer()
    return build_tiny(str(tmp_path_factory.mktemp("tiny")))


def optimizer_groups(ckpt: str, python: str = TRAINER_PYTHON) -> list[dict]:
    """lr, weight_decay and betas of each parameter group of the optimizer DeepSpeed stepped,
    read back from rank 0's ZeRO optimizer shard of a checkpoint."""
    shard = glob.glob(os.path.join(ckpt, "global_step*", "zero_pp_rank_0_mp_rank_00_optim_states.pt"))
    assert len(shard) == 1, os.listdir(ckpt)
    code = (
        "import json, sys, torch\n"
        "sd = torch.load(sys.argv[1], map_location='cpu', weights_only=False)['optimizer_state_dict']\n"
        "base = sd.get('base_optimizer_state', sd.get('optimizer_state_dict', sd))\n"
        "keys = ('lr', 'weight_decay', 'betas')\n"
        "print(json.dumps([{k: g[k] for k in keys} for g in base['param_groups']]))\n")
    r = subprocess.run([python, "-c", code, shard[0]], capture_output=True, text=True, timeout=limit(300))
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_lf(make_hostset, tmp_path, tiny, **kw):
    out = str(tmp_path / "out")
    with make_hostset(2) as hs:
        spec = lf_spec(tiny, [h.ip for h in hs.hosts], 1, out, hs=hs, **kw)
        r = submit_timed(tmp_path, spec)
    return r, out


def test_loraplus_zero2_keeps_two_learning_rates(make_hostset, tmp_path, tiny):
    r, out = run_lf(make_hostset, tmp_path, tiny, deepspeed={"stage": 2},
                    passthrough={"loraplus_lr_ratio": 16.0})
    assert_trained(r, out, 6)
    assert "Using LoRA+ optimizer with loraplus lr ratio 16.00." in r.stdout
    assert "mlaunch: optimizer AdamW: 2 parameter groups (lr 0.001 × " in r.stdout
    assert "lr 0.016 × " in r.stdout and "2 empty removed" in r.stdout
    groups = optimizer_groups(os.path.join(out, "checkpoint-6"))
    lrs = [g["lr"] for g in groups]   # constant schedule: the groups' own learning rates
    assert lrs == pytest.approx([1.0e-3, 1.6e-2]), groups


@pytest.mark.parametrize("stage", [2, 3])
def test_weight_decay_and_beta2_train_under_zero(make_hostset, tmp_path, tiny, stage):
    r, out = run_lf(make_hostset, tmp_path, tiny, deepspeed={"stage": stage},
                    finetuning={"type": "full"} if stage == 3 else None,
                    passthrough={"weight_decay": 0.1, "adam_beta2": 0.95})
    assert_trained(r, out, 6)
    groups = optimizer_groups(os.path.join(out, "checkpoint-6"))
    # LoRA: one group (LoRA weights all decay); full: decay and no-decay (norms) groups.
    assert [g["weight_decay"] for g in groups] == ([0.1] if stage == 2 else [0.1, 0.0]), groups
    assert all(g["betas"] == [0.9, 0.95] for g in groups), groups
    # These two runs are also test_training's LoRA/ZeRO-2 and full/ZeRO-3 variants.
    assert_outputs(out, tiny, lora=stage == 2, zero=True)


def write_user_config(tmp_path) -> str:
    """A ds_config.json as the seeds hand them out: "auto" everywhere plus tuning keys."""
    path = tmp_path / "my_ds.json"
    path.write_text(json.dumps({
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
        "steps_per_print": 7, "wall_clock_breakdown": False,
        "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True,
                              "allgather_bucket_size": 123456788, "reduce_bucket_size": "auto",
                              "round_robin_gradients": True}}))
    return str(path)


def test_user_ds_config_with_auto_and_tuning_trains(make_hostset, tmp_path, tiny):
    from .helpers import mlaunch, write_spec
    out = str(tmp_path / "out")
    with make_hostset(2) as hs:
        spec = lf_spec(tiny, [h.ip for h in hs.hosts], 2, out, hs=hs,
                       deepspeed={"config": write_user_config(tmp_path)})
        dry = mlaunch("submit", write_spec(tmp_path, spec), "--dry-run")
        r = submit_timed(tmp_path, spec)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    text = dry.stdout.split("ds_config.json ===\n", 1)[1]
    rendered = json.loads(text[text.index("\n{") + 1:text.index("\n}\n") + 2])
    hidden = json.load(open(os.path.join(tiny["model"], "config.json")))["hidden_size"]
    assert rendered["train_batch_size"] == 8 and rendered["train_micro_batch_size_per_gpu"] == 2
    assert rendered["gradient_accumulation_steps"] == 1 and rendered["gradient_clipping"] == 1.0
    assert rendered["bf16"] == {"enabled": False} and rendered["fp16"] == {"enabled": False}
    assert rendered["steps_per_print"] == 7 and rendered["wall_clock_breakdown"] is False
    assert rendered["zero_optimization"] == {
        "stage": 2, "overlap_comm": False, "contiguous_gradients": True,
        "allgather_bucket_size": 123456788, "reduce_bucket_size": hidden * hidden,
        "round_robin_gradients": True}
    assert "optimizer" not in rendered
    assert ("# zero_optimization.reduce_bucket_size" in text
            and f"auto -> transformers' rule h², h = {hidden}" in text)
    assert "# train_batch_size" in text and "auto -> 2 nodes × 2 GPUs × 2 per device × 1 accumulation" in text
    assert_trained(r, out, 6)


@pytest.mark.parametrize("variant", ["lora-zero2", "full-zero3"])
def test_swift_deepspeed_trains_with_swift_defaults(make_hostset, tmp_path, tiny, variant):
    """ms-swift's own optimizer defaults (weight_decay 0.1, adam_beta2 0.95: nothing in
    passthrough) under ZeRO-2 (LoRA, the `zero2` name) and ZeRO-3 (full fine-tuning)."""
    require_swift()
    out = str(tmp_path / "out")
    with make_hostset(2) as hs:
        spec = swift_spec(tiny, [h.ip for h in hs.hosts], 1, out, hs=hs)
        if variant == "full-zero3":
            spec["finetuning"] = {"type": "full"}
            spec["deepspeed"] = {"stage": 3}
        else:
            spec["deepspeed"] = "zero2"
        r = submit_timed(tmp_path, spec)
    swift_trained(r, out, 6)
    args = json.load(open(glob.glob(os.path.join(out, "v*-*", "args.json"))[0]))
    assert (args["weight_decay"], args["adam_beta2"]) == (0.1, 0.95)
    ckpt = swift_checkpoint(out, 3)
    shards = glob.glob(os.path.join(ckpt, "global_step3", "*optim_states.pt"))
    assert len(shards) == 2, os.listdir(ckpt)   # one per rank: 2 hosts x 1 process
    groups = optimizer_groups(ckpt, SWIFT_PYTHON)   # ms-swift's defaults reached the optimizer
    assert groups and all(g["betas"] == [0.9, 0.95] for g in groups), groups
    assert 0.1 in [g["weight_decay"] for g in groups], groups

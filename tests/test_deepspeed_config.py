"""The DeepSpeed section: "auto" resolved to the trainer's numbers, where each value came
from, tuning kept, and one line per contradiction (launcher/spec/deepspeed.py)."""
from __future__ import annotations

import copy
import json
import os

import pytest

from launcher.errors import SpecError
from launcher.plan.launch_plan import build_plan
from launcher.view.present import describe_plan
from launcher.spec import load_spec, validate
from launcher.spec.deepspeed import build_for

from .helpers import CONFIGS, load_yaml, seed000, write_spec

SWIFT_LORA = os.path.join(CONFIGS, "seed003-qwen2.5-14b-swift-lora.yaml")
HIDDEN = 64


@pytest.fixture
def model(tmp_path):
    """A model directory whose config.json mlaunch can read (hidden size 64)."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"hidden_size": HIDDEN, "num_hidden_layers": 2}))
    return str(d)


def lf_job(model: str, ds, **passthrough) -> dict:
    """seed 000's 4 nodes × 4 GPUs, per-device 2, accumulation 8 (global 256), bf16."""
    data = seed000()
    data["model"], data["deepspeed"] = model, ds
    data["passthrough"] = passthrough
    return data


def user_file(tmp_path, content: dict) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(content))
    return str(path)


def problems(data: dict) -> list[str]:
    with pytest.raises(SpecError) as err:
        validate(data)
    return [str(p) for p in err.value.problems]


SEED_FILE = {  # the shape both seeds hand out
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto", "loss_scale": 0},
    "steps_per_print": 10, "wall_clock_breakdown": False,
    "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                          "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                          "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto",
                          "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                          "stage3_gather_16bit_weights_on_model_save": True,
                          "round_robin_gradients": True},
}


def test_user_file_auto_resolved_tuning_kept(tmp_path, model):
    built = build_for(validate(lf_job(model, {"config": user_file(tmp_path, SEED_FILE)})))
    cfg = built.config
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"],
            cfg["gradient_accumulation_steps"], cfg["gradient_clipping"]) == (256, 2, 8, 1.0)
    assert cfg["bf16"] == {"enabled": True} and cfg["fp16"] == {"enabled": False, "loss_scale": 0}
    z = cfg["zero_optimization"]
    assert (z["reduce_bucket_size"], z["stage3_prefetch_bucket_size"],
            z["stage3_param_persistence_threshold"]) == (HIDDEN ** 2, int(0.9 * HIDDEN ** 2), 10 * HIDDEN)
    kept = {k: v for k, v in SEED_FILE["zero_optimization"].items() if v != "auto"}
    assert {k: z[k] for k in kept} == kept and cfg["steps_per_print"] == 10
    assert "optimizer" not in cfg and "auto" not in json.dumps(cfg)
    src = built.sources
    assert src["train_batch_size"] == "auto -> 4 nodes × 4 GPUs × 2 per device × 8 accumulation"
    assert src["zero_optimization.reduce_bucket_size"] == (
        f"auto -> transformers' rule h², h = {HIDDEN} ({model}/config.json)")
    assert src["zero_optimization.round_robin_gradients"].startswith("your file ")


def test_dry_run_prints_sources_above_the_json(tmp_path, model):
    spec = lf_job(model, {"config": "ds.json"})
    user_file(tmp_path, SEED_FILE)
    job = load_spec(write_spec(tmp_path, spec))   # config relative to the spec's directory
    assert job.deepspeed.config == str(tmp_path / "ds.json")
    text = describe_plan(build_plan(job, run_id="R"))
    block = text.split("ds_config.json ===\n", 1)[1]
    head, body = block.split("\n{", 1)
    assert head.startswith("# where each value comes from (not part of the file):\n")
    assert "# train_batch_size" in head and "= 256  <- auto -> 4 nodes × 4 GPUs" in head
    json.loads("{" + body.split("\n}\n", 1)[0] + "\n}")   # the file itself stays plain JSON


def test_spec_form_defaults_follow_transformers_buckets(model):
    cfg = build_for(validate(lf_job(model, {"stage": 3}))).config
    z = cfg["zero_optimization"]
    assert (z["reduce_bucket_size"], z["stage3_prefetch_bucket_size"],
            z["stage3_param_persistence_threshold"]) == (4096, 3686, 640)
    assert "optimizer" not in cfg and "zero_allow_untested_optimizer" not in cfg


def test_spec_tuning_fields_override_defaults(model):
    ds = {"stage": 3, "overlap_comm": False, "reduce_bucket_size": 5e8, "sub_group_size": 100,
          "stage3_prefetch_bucket_size": 7, "stage3_param_persistence_threshold": 9,
          "contiguous_gradients": False, "stage3_max_live_parameters": 11}
    built = build_for(validate(lf_job(model, ds)))
    z = built.config["zero_optimization"]
    assert {k: z[k] for k in ds if k != "stage"} == {**{k: v for k, v in ds.items() if k != "stage"},
                                                     "reduce_bucket_size": 500000000}
    assert built.sources["zero_optimization.overlap_comm"] == "spec: deepspeed.overlap_comm"
    assert built.sources["zero_optimization.stage"] == "spec: deepspeed.stage"
    assert built.sources["zero_optimization.stage3_max_reuse_distance"] == "mlaunch default"


def test_model_not_readable_keeps_auto_for_bucket_keys_only():
    built = build_for(validate(lf_job("/nowhere/model", {"stage": 3})))
    autos = sorted(k for k, v in built.config["zero_optimization"].items() if v == "auto")
    assert autos == ["reduce_bucket_size", "stage3_param_persistence_threshold",
                     "stage3_prefetch_bucket_size"]
    assert built.sources["zero_optimization.reduce_bucket_size"] == (
        'kept "auto": transformers sets h² from the loaded model at start '
        "(/nowhere/model/config.json is not readable here)")


def test_optimizer_block_autos_take_the_trainers_values(tmp_path, model):
    f = user_file(tmp_path, {**SEED_FILE, "optimizer": {"type": "AdamW", "params": {
        "lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupDecayLR", "params": {
            "warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto",
            "total_num_steps": "auto"}}})
    data = lf_job(model, {"config": f}, adam_beta2=0.95, weight_decay=0.1)
    data["training"] = {**data["training"], "max_steps": 100, "warmup_ratio": 0.1}
    del data["training"]["epochs"]
    cfg = build_for(validate(data)).config
    assert cfg["optimizer"]["params"] == {"lr": 2e-5, "betas": [0.9, 0.95], "eps": 1e-8,
                                          "weight_decay": 0.1}
    assert cfg["scheduler"]["params"] == {"warmup_min_lr": 0, "warmup_max_lr": 2e-5,
                                          "warmup_num_steps": 10, "total_num_steps": 100}


def test_swift_names_are_swifts_own_files_resolved(model):
    data = copy.deepcopy(load_yaml(SWIFT_LORA))
    data["model"], data["deepspeed"] = model, "zero3_offload"
    built = build_for(validate(data))
    z = built.config["zero_optimization"]
    assert z["stage"] == 3 and z["offload_param"]["device"] == "cpu" and z["overlap_comm"] is False
    assert z["sub_group_size"] == 1000000000 and z["reduce_bucket_size"] == HIDDEN ** 2
    assert built.sources["zero_optimization.sub_group_size"] == "ms-swift 4.6 zero3_offload.json"
    data["deepspeed"] = "zero2"
    z = build_for(validate(data)).config["zero_optimization"]
    assert (z["stage"], z["reduce_bucket_size"], z["allgather_bucket_size"]) == (2, 200000000, 200000000)


BAD = [  # (file content over SEED_FILE, passthrough, the one line)
    ({"train_batch_size": 64}, {},
     'deepspeed.config: train_batch_size 64 in your file {f} ≠ 4 nodes × 4 GPUs × 2 per device × '
     '8 accumulation = 256; set it to "auto" or change the spec\'s batch'),
    ({"train_micro_batch_size_per_gpu": 4}, {},
     'deepspeed.config: train_micro_batch_size_per_gpu 4 in your file {f} ≠ batch.per_device = 2; '
     'set it to "auto" or change the spec\'s batch'),
    ({"gradient_accumulation_steps": 1}, {},
     'deepspeed.config: gradient_accumulation_steps 1 in your file {f} ≠ batch.grad_accum = 8; '
     'set it to "auto" or change the spec\'s batch'),
    ({"gradient_clipping": 0.5}, {},
     'deepspeed.config: gradient_clipping 0.5 in your file {f} ≠ training.max_grad_norm = 1.0; '
     'set it to "auto" or change training.max_grad_norm'),
    ({"fp16": {"enabled": True}}, {},
     'deepspeed.config: fp16.enabled true in your file {f} ≠ precision bf16 = false; '
     'set it to "auto" or change precision'),
    ({"steps_per_print": "auto"}, {},
     'deepspeed.config: steps_per_print: "auto" in your file {f} is filled by neither '
     'transformers nor mlaunch; give a value'),
    ({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}, {},
     "deepspeed.config: zero_optimization.offload_param exists only in ZeRO-3 (stage is 2); "
     "use offload_optimizer, or stage 3"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}, {"loraplus_lr_ratio": 16.0},
     "deepspeed.config: optimizer block in your file {f} replaces the optimizer that "
     "passthrough.loraplus_lr_ratio asks for (transformers hands DeepSpeed a placeholder, "
     "LLaMA-Factory's custom optimizer never runs); remove the block"),
    ({"optimizer": {"type": "AdamW", "params": {"weight_decay": 0.0}}}, {"weight_decay": 0.1},
     'deepspeed.config: optimizer.params.weight_decay 0.0 in your file {f} ≠ '
     'passthrough.weight_decay = 0.1; set it to "auto" (transformers stops at start on a mismatch)'),
]


@pytest.mark.parametrize("change,passthrough,line", BAD, ids=[b[2].split(":")[1][:40] for b in BAD])
def test_contradicting_user_file_refused_in_one_line(tmp_path, model, change, passthrough, line):
    f = user_file(tmp_path, {**SEED_FILE, **change})
    assert problems(lf_job(model, {"config": f}, **passthrough)) == [line.format(f=f)]


def test_swift_user_file_with_optimizer_refused(tmp_path, model):
    data = copy.deepcopy(load_yaml(SWIFT_LORA))
    f = user_file(tmp_path, {**SEED_FILE, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})
    data["model"], data["deepspeed"] = model, {"config": f}
    assert problems(data) == [
        f"deepspeed.config: optimizer block in your file {f}: ms-swift builds its own optimizer and "
        "stops with \"'DummyOptim' object has no attribute 'param_groups'\"; remove the block "
        "(weight_decay, adam_beta2... go in passthrough)"]


SPEC_BAD = [
    ({"stage": 2, "config": "/x.json"}, "deepspeed: give exactly one of stage (0-3), config (your "
     "ds_config.json) or name (ms-swift's zero2, zero3, ...); got stage and config"),
    ({"overlap_comm": True}, "deepspeed: give exactly one of stage (0-3), config (your "
     "ds_config.json) or name (ms-swift's zero2, zero3, ...)"),
    ({"stage": 2, "stage3_prefetch_bucket_size": 10},
     "deepspeed.stage3_prefetch_bucket_size: only applies to ZeRO-3 (stage is 2); remove it or use stage 3"),
    ({"config": "/nonexistent/ds.json"},
     "deepspeed.config: cannot read /nonexistent/ds.json: No such file or directory; give the "
     "path of a readable JSON file (a relative one is taken from the spec's folder), or leave "
     "config out and let mlaunch write it (deepspeed: {stage: N})"),
    ({"name": "zero3"}, "deepspeed.name: zero3 is ms-swift's config name; use {stage: 3} or config: FILE"),
]


@pytest.mark.parametrize("ds,line", SPEC_BAD, ids=[s[1][:45] for s in SPEC_BAD])
def test_bad_deepspeed_section_one_line(model, ds, line):
    assert problems(lf_job(model, ds)) == [line]


def test_user_file_not_json_and_extra_fields(tmp_path, model):
    bad = tmp_path / "bad.json"
    bad.write_text("{'stage': 2}")
    (line,) = problems(lf_job(model, {"config": str(bad)}))
    assert line.startswith(f"deepspeed.config: {bad} is not JSON: Expecting property name")
    f = user_file(tmp_path, SEED_FILE)
    assert problems(lf_job(model, {"config": f, "overlap_comm": False})) == [
        f"deepspeed.overlap_comm: set it in {f}, or drop deepspeed.config"]


def test_swift_name_beside_fields_refused(model):
    data = copy.deepcopy(load_yaml(SWIFT_LORA))
    data["model"], data["deepspeed"] = model, {"name": "zero2", "overlap_comm": True}
    assert problems(data) == ["deepspeed.overlap_comm: not beside name zero2: give stage 2 with "
                              "tuning fields instead, or the name alone"]
    data["deepspeed"] = "zero4"
    assert problems(data) == ["deepspeed.name: 'zero4' is not one of zero0, zero1, zero2, zero3, "
                              "zero2_offload, zero3_offload; did you mean 'zero3'?"]


def test_qlora_with_a_zero3_user_file_takes_4_bit_only(tmp_path, model):
    """LLaMA-Factory (and transformers) load bnb 4-bit weights sharded under ZeRO-3 (QLoRA
    with ZeRO-3, as its examples do); 8-bit they refuse on the nodes, so mlaunch before."""
    data = lf_job(model, {"config": user_file(tmp_path, SEED_FILE)})
    data["finetuning"] = {**data["finetuning"], "quantization_bit": 4}
    assert validate(data).finetuning.quantization_bit == 4
    data["finetuning"]["quantization_bit"] = 8
    assert problems(data) == ["finetuning.quantization_bit: 8-bit cannot be combined with ZeRO-3: only bnb "
                              "4-bit can (QLoRA under ZeRO-3); use 4, or deepspeed stage 0-2"]


def test_literal_errors_list_their_choices(model):
    data = lf_job(model, {"stage": 2})
    data["finetuning"] = {**data["finetuning"], "quantization_bit": 2}
    # lf's rule names the widths of every quantization method (bnb is the default).
    assert problems(data) == ["finetuning.quantization_bit: 2 is not one of 4, 8 for quantization_method "
                              "bnb (hqq: 1, 2, 3, 4, 5, 6, 8; eetq: 8)"]
    assert problems(lf_job(model, {"stage": 5})) == ["deepspeed.stage: 5 is not one of 0, 1, 2, 3"]


def test_odd_allgather_bucket_refused(tmp_path, model):
    """DeepSpeed's ZeRO-1/2 asserts it on every rank at start (seen in a real run)."""
    assert problems(lf_job(model, {"stage": 2, "allgather_bucket_size": 123456789})) == [
        "deepspeed.allgather_bucket_size: zero_optimization.allgather_bucket_size 123456789 is odd; "
        "ZeRO-1/2 asserts it is a multiple of 2 (deepspeed/runtime/zero/stage_1_and_2.py)"]
    f = user_file(tmp_path, {**SEED_FILE, "zero_optimization": {"stage": 1, "allgather_bucket_size": 3}})
    assert problems(lf_job(model, {"config": f})) == [
        "deepspeed.config: zero_optimization.allgather_bucket_size 3 is odd; "
        "ZeRO-1/2 asserts it is a multiple of 2 (deepspeed/runtime/zero/stage_1_and_2.py)"]


def test_zero3_init_flag(tmp_path, model):
    assert validate(lf_job(model, {"stage": 3, "zero3_init_flag": True}))
    assert validate(lf_job(model, {"config": user_file(tmp_path, SEED_FILE), "zero3_init_flag": True}))
    assert problems(lf_job(model, {"stage": 2, "zero3_init_flag": True})) == [
        "deepspeed.zero3_init_flag: only applies to ZeRO-3 (give stage 3, a ZeRO-3 config or name, "
        "or remove it)"]
    assert problems(lf_job(model, {"stage": 3, "zero3_init_flag": False})) == [
        "deepspeed.zero3_init_flag: false cannot be honoured: under ZeRO-3 the HF Trainer "
        "(LLaMA-Factory, ms-swift) always loads the model inside deepspeed.zero.Init (transformers' "
        "is_deepspeed_zero3_enabled reads the stage; accelerate's flag is not consulted); remove "
        "it, or use ZeRO-2"]


def test_batch_left_to_mlaunch(tmp_path, model):
    """per_device omitted (mlaunch chooses it later): train_batch_size is checked against
    global; a file that fixes the micro-batch itself is refused."""
    data = lf_job(model, {"config": user_file(tmp_path, {**SEED_FILE, "train_batch_size": 128})})
    data["batch"] = {"global": 256}
    assert problems(data) == [
        f"deepspeed.config: train_batch_size 128 in your file {tmp_path / 'ds.json'} ≠ batch.global = "
        "256; set it to \"auto\" or change the spec's batch"]
    data["deepspeed"] = {"config": user_file(tmp_path, {**SEED_FILE, "train_micro_batch_size_per_gpu": 4})}
    assert problems(data) == [
        f"deepspeed.config: train_micro_batch_size_per_gpu 4 in your file {tmp_path / 'ds.json'} but "
        "batch.per_device is left to mlaunch; set it to \"auto\" or give batch.per_device"]
    data["deepspeed"] = {"config": user_file(tmp_path, SEED_FILE)}
    cfg = build_for(build_plan(validate(data), run_id="R").job).config
    assert cfg["train_batch_size"] == 256
    assert cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * 16 == 256


def test_zero_of_reads_every_form(tmp_path, model):
    """The memory estimate sees the ZeRO stage of a user file and of an ms-swift name too."""
    from launcher.spec.ds_rules import zero_of
    assert zero_of(validate(lf_job(model, {"config": user_file(tmp_path, SEED_FILE)}))) == (3, False, False)
    data = copy.deepcopy(load_yaml(SWIFT_LORA))
    data["model"], data["deepspeed"] = model, "zero3_offload"
    assert zero_of(validate(data)) == (3, True, True)
    assert zero_of(validate(lf_job(model, {"stage": 2, "offload_optimizer": "cpu"}))) == (2, True, False)

"""ms-swift as its users run it: stages, its own defaults, Megatron layouts, passthrough names.

Each refusal and note is one line, asserted as text.
"""
from __future__ import annotations

import json

import pytest

from launcher.errors import UserError
from launcher.plan.launch_plan import build_plan
from launcher.view.present import describe_plan
from launcher.spec import validate
from launcher.runs.attempts import SubmitOptions, check_flags as submit
from launcher.plan.trainers import TRAINERS, RunContext

from .test_swift import argv, flags, problems, swift_lora, swift_megatron

RUN = RunContext(run_id="R", run_dir="/runs/R")


def bare_lora() -> dict:
    """The seed 003 LoRA job with every field ms-swift has its own default for left out."""
    data = swift_lora()
    data["finetuning"] = {"type": "lora", "lora_rank": 8}
    data["training"].pop("logging_steps")
    data.pop("max_length")
    return data


def notes(data: dict) -> list[str]:
    return [line for line in describe_plan(build_plan(validate(data), run_id="R")).splitlines()
            if line.startswith("note: ")]


# --- stages -------------------------------------------------------------------------------

@pytest.mark.parametrize("stage,rlhf,module", [
    ("sft", None, "swift.cli.sft"), ("pt", None, "swift.cli.pt"), ("rlhf", "dpo", "swift.cli.rlhf"),
    ("rlhf", "kto", "swift.cli.rlhf"), ("rlhf", "grpo", "swift.cli.rlhf"),
    ("rlhf", "gkd", "swift.cli.rlhf"), ("rlhf", "rm", "swift.cli.rlhf")])
def test_stage_picks_the_entry_module(stage, rlhf, module):
    data = swift_lora()
    data["stage"] = stage
    if rlhf:
        data["rlhf_type"] = rlhf
    args = argv(data)
    assert args[:2] == ["-m", module]
    assert flags(args).get("rlhf_type") == ([rlhf] if rlhf else None)


@pytest.mark.parametrize("stage,module", [("pt", "swift.cli._megatron.pt"),
                                          ("rlhf", "swift.cli._megatron.rlhf")])
def test_megatron_stages(stage, module):
    data = swift_megatron()
    data["stage"] = stage
    if stage == "rlhf":
        data["rlhf_type"] = "dpo"
    assert argv(data)[:2] == ["-m", module]


STAGE_CASES = [
    ({"stage": "rlhf"}, "rlhf_type: required with stage rlhf: one of dpo, orpo, simpo, kto, cpo, rm, ppo, grpo, gkd"),
    ({"rlhf_type": "dpo"}, "rlhf_type: only applies to stage rlhf, but stage is sft; set stage: rlhf or remove it"),
    ({"passthrough": {"rlhf_type": "dpo"}}, "passthrough.rlhf_type: `swift sft` has no --rlhf_type, so every "
     "node would stop at start; set stage: rlhf and rlhf_type: dpo instead"),
]


@pytest.mark.parametrize("extra,line", STAGE_CASES, ids=["no-type", "type-without-stage", "passthrough"])
def test_stage_mistakes(extra, line):
    data = swift_lora()
    data.update(extra)
    assert problems(data) == [line]


def test_megatron_rlhf_type_subset():
    data = swift_megatron()
    data.update(stage="rlhf", rlhf_type="orpo")
    assert problems(data) == ["rlhf_type: Megatron-SWIFT's rlhf takes dpo, kto, grpo, gkd, rm, not orpo; "
                              "choose one of those or drop the megatron section"]


# --- ms-swift's own defaults ------------------------------------------------------------------

def test_left_out_fields_take_swifts_defaults():
    f = flags(argv(bare_lora()))
    assert (f["lora_alpha"], f["lora_dropout"], f["logging_steps"]) == (["32"], ["0.05"], ["5"])
    assert "max_length" not in f    # ms-swift then uses the model's maximum
    assert notes(bare_lora()) == [
        "note: default finetuning.lora_alpha: 32 (ms-swift's default --lora_alpha)",
        "note: default finetuning.lora_dropout: 0.05 (ms-swift's default --lora_dropout)",
        "note: default training.logging_steps: 5 (ms-swift's default --logging_steps)",
        "note: default max_length: the model's maximum (not rendered) (ms-swift's default --max_length)"]


def test_given_fields_win_and_print_no_note():
    data = bare_lora()
    data["finetuning"].update(lora_alpha=16, lora_dropout=0.0)
    data["training"]["logging_steps"] = 10
    data["max_length"] = 1024
    f = flags(argv(data))
    assert (f["lora_alpha"], f["lora_dropout"], f["logging_steps"], f["max_length"]) == \
        (["16"], ["0.0"], ["10"], ["1024"])
    assert notes(data) == []


def test_full_finetuning_shows_no_lora_defaults():
    data = bare_lora()
    data["finetuning"] = {"type": "full"}
    assert [n for n in notes(data) if "lora" in n] == []


@pytest.mark.parametrize("megatron,training,want", [
    ({}, {}, ["selective"]),                                   # Megatron-SWIFT's default
    ({"recompute": "full"}, {}, ["full", "uniform", "1"]),
    ({"recompute": "none"}, {}, ["none"]),
    ({}, {"gradient_checkpointing": True}, ["full", "uniform", "1"]),
    ({}, {"gradient_checkpointing": False}, ["none"]),
    ({"recompute": "selective"}, {"gradient_checkpointing": True}, ["selective"]),
])
def test_megatron_recompute(megatron, training, want):
    data = swift_megatron()
    data["megatron"].update(megatron)
    data["training"].update(training)
    f = flags(argv(data))
    got = f["recompute_granularity"] + f.get("recompute_method", []) + f.get("recompute_num_layers", [])
    assert got == want
    shown = any("megatron.recompute: selective" in n for n in notes(data))
    assert shown == (not megatron and not training)


def test_recompute_contradiction():
    data = swift_megatron()
    data["megatron"]["recompute"] = "full"
    data["training"]["gradient_checkpointing"] = False
    assert problems(data) == ["megatron.recompute: full contradicts training.gradient_checkpointing: "
                              "false; remove one of them"]


# --- Megatron layouts: cp, ep, etp ------------------------------------------------------------

def layout(tmp_path=None, experts=None, **megatron) -> dict:
    data = swift_megatron()
    data["megatron"] = megatron
    data["batch"].pop("global")
    if tmp_path is not None:
        cfg = {"num_hidden_layers": 48, "num_attention_heads": 40}
        if experts:
            cfg["num_experts"] = experts
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        data["model"] = str(tmp_path)
    return data


def test_context_parallel_lowers_dp_not_the_micro_batch_count():
    # 8 GPUs, tp 2, cp 2: dp = 8 / (2 x 1 x 2) = 2; per_device 1, grad_accum 8 -> global 16,
    # so Megatron runs 16 / (1 x 2) = 8 micro-batches per step, as the spec says (not 16).
    data = layout(tp=2, cp=2)
    data["batch"].update(per_device=1, grad_accum=8)
    f = flags(argv(data))
    assert f["context_parallel_size"] == ["2"] and f["global_batch_size"] == ["16"]
    assert int(f["global_batch_size"][0]) // (1 * 2) == 8
    data["batch"]["global"] = 32
    assert problems(data) == ["batch.global: 32 ≠ dp 2 × 1 per device × 8 accumulation = 16 (dp = 8 GPUs "
                              "/ (tp 2 × pp 1 × cp 2)); set global to 16, change per_device/grad_accum, "
                              "or omit global"]
    plan = describe_plan(build_plan(validate(layout(tp=2, cp=2)), run_id="R"))
    assert "megatron: tp 2 × pp 1 × cp 2 × dp 2 = 8" in plan


def test_cp_must_fit_the_world():
    assert problems(layout(tp=2, pp=2, cp=4)) == [
        "megatron: tp 2 × pp 2 × cp 4 = 16 does not divide the world size 8 (2 nodes × 4 GPUs), so no "
        "whole number of data-parallel replicas fits; choose tp × pp × cp among 1, 2, 4, 8"]


def test_expert_layout_rendered_and_checked(tmp_path):
    data = layout(tmp_path, experts=64, tp=2, ep=4, etp=1, sequence_parallel=True)
    f = flags(argv(data))
    assert f["expert_model_parallel_size"] == ["4"] and "expert_tensor_parallel_size" not in f
    assert "megatron: tp 2 × pp 1 × cp 1 × dp 4 = 8; experts: ep 4 × etp 1" in \
        describe_plan(build_plan(validate(data), run_id="R"))
    assert problems(layout(tmp_path, experts=64, pp=2, ep=4, etp=2)) == [
        "megatron.ep: etp 2 × ep 4 × pp 2 = 16 does not divide the world size 8, so Megatron cannot "
        "lay out the expert layers; choose etp × ep × pp among 1, 2, 4, 8"]


def test_ep_with_tp_needs_sequence_parallel(tmp_path):
    assert problems(layout(tmp_path, experts=64, tp=2, ep=4)) == [
        "megatron.sequence_parallel: ep 4 with tp 2 needs it: Megatron-Core runs expert parallelism "
        "beside tensor parallelism only with sequence parallelism; set sequence_parallel: true"]


def test_ep_must_divide_the_experts(tmp_path):
    assert problems(layout(tmp_path, experts=60, ep=8)) == [
        f"megatron.ep: the model has 60 experts ({tmp_path}/config.json), not divisible by ep 8; "
        "choose ep among 1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60"]
    assert problems(layout(tmp_path, ep=2)) == [
        f"megatron.ep: 2 needs a mixture-of-experts model, but {tmp_path}/config.json names no "
        "experts; set ep to 1"]


@pytest.mark.parametrize("key,field", [("context_parallel_size", "megatron.cp"),
                                       ("expert_model_parallel_size", "megatron.ep"),
                                       ("expert_tensor_parallel_size", "megatron.etp")])
def test_layout_passthrough_refused(key, field):
    data = swift_megatron()
    data["passthrough"] = {key: 2}
    assert problems(data) == [f"passthrough.{key}: mlaunch owns this argument; set {field} instead"]


# --- what swift accepts: finetune true, sequence_parallel with tp 1 ----------------------------

def test_finetune_true_is_accepted_and_not_rendered():
    data = swift_megatron()
    data["passthrough"] = {"finetune": True}
    assert "--finetune" not in argv(data)
    assert "note: passthrough finetune: true is Megatron-SWIFT's default (load weights only; a resume " \
           "renders --finetune false); not rendered" in notes(data)
    run = RunContext(run_id="R", run_dir="/runs/R", resume_from="/o/v0-x/checkpoint-10")
    assert flags(argv(data, run))["finetune"] == ["false"]


def test_finetune_false_points_at_resume():
    data = swift_megatron()
    data["passthrough"] = {"finetune": False}
    assert problems(data) == ["passthrough.finetune: false continues a Megatron checkpoint's iteration "
                              "and optimizer, which mlaunch renders itself when resuming; use --resume "
                              "(or max_restarts) instead"]


def test_sequence_parallel_with_tp1_is_accepted_with_a_note():
    data = swift_megatron()
    data["megatron"] = {"tp": 1, "pp": 2, "sequence_parallel": True}
    data["batch"]["global"] = 64
    assert flags(argv(data))["sequence_parallel"] == ["true"]
    assert "note: megatron.sequence_parallel with tp 1: ms-swift turns it off (megatron_args.py: " \
           "sequence_parallel needs tp > 1); no effect" in notes(data)


# --- nothing resumable ----------------------------------------------------------------------

NO_SAVE_OPTIM = ("passthrough no_save_optim: true saves no optimizer state (and with safetensors no "
                 "Megatron weights), so no checkpoint can be resumed")
SAVE_ONLY_MODEL = ("passthrough save_only_model: true saves no optimizer, scheduler or RNG state "
                   "(and no DeepSpeed engine state), so no checkpoint can be resumed")


@pytest.mark.parametrize("mega,key,why", [(True, "no_save_optim", NO_SAVE_OPTIM),
                                          (False, "save_only_model", SAVE_ONLY_MODEL)])
def test_restarts_that_can_only_start_over(mega, key, why):
    data = swift_megatron() if mega else swift_lora()
    data["passthrough"] = {key: True}
    assert validate(data)   # without restarts: fine, a run that never resumes
    data["max_restarts"] = 2
    assert problems(data) == [f"max_restarts: 2: no restart could resume a checkpoint: {why}; remove that "
                              "key or set max_restarts: 0"]
    data["max_restarts"] = 0
    job = validate(data)
    with pytest.raises(UserError) as err:
        submit(job, SubmitOptions(resume="latest"))
    assert str(err.value) == f"--resume: nothing can be resumed: {why}; remove that key or drop --resume"
    with pytest.raises(UserError) as err:
        submit(job, SubmitOptions(max_restarts=1))
    assert str(err.value) == (f"--max-restarts 1: nothing can be resumed: {why}; remove that key or "
                              "drop --max-restarts 1")


# --- passthrough names: ms-swift's and LLaMA-Factory's own --------------------------------------

@pytest.mark.parametrize("mega,stage,key,line", [
    (False, "sft", "lora_rnak", "passthrough.lora_rnak: not an argument of ms-swift 4.6.0 `swift sft`; "
     "did you mean 'lora_rank'?"),
    (False, "sft", "save_totl_limit", "passthrough.save_totl_limit: not an argument of ms-swift 4.6.0 "
     "`swift sft`; did you mean 'save_total_limit'?"),
    (False, "sft", "beta", "passthrough.beta: not an argument of ms-swift 4.6.0 `swift sft`; it is an "
     "argument of `swift rlhf` (set stage: rlhf)"),
    (False, "sft", "no_save_optim", "passthrough.no_save_optim: not an argument of ms-swift 4.6.0 "
     "`swift sft`; it is an argument of `megatron sft` (add a megatron section)"),
    (True, "sft", "save_only_model", "passthrough.save_only_model: not an argument of ms-swift 4.6.0 "
     "`megatron sft`; it is an argument of `swift sft` (drop the megatron section)"),
    (False, "sft", "frobnicate", "passthrough.frobnicate: not an argument of ms-swift 4.6.0 `swift sft`; "
     "check the spelling against the trainer's --help"),
])
def test_unknown_swift_names(mega, stage, key, line):
    data = swift_megatron() if mega else swift_lora()
    data["passthrough"] = {key: 1}
    assert problems(data) == [line]


def test_rlhf_names_accepted_in_rlhf_only():
    data = swift_lora()
    data.update(stage="rlhf", rlhf_type="dpo", passthrough={"beta": 0.1, "rpo_alpha": 0.5})
    assert flags(argv(data))["beta"] == ["0.1"]


def test_llamafactory_passthrough_names():
    from .helpers import CONFIGS, load_yaml
    data = load_yaml(f"{CONFIGS}/seed000-qwen2-7b-lora.yaml")
    data["passthrough"] = {"flash_attn": "fa2", "report_to": None, "save_total_limt": 3}
    data["passthrough"].pop("report_to")
    assert problems(data) == ["passthrough.save_total_limt: not an argument of LLaMA-Factory 0.9.5; "
                              "did you mean 'save_total_limit'?"]


# --- Megatron-SWIFT 4.x: discovery on the planted save layout, then the resume arguments ------

@pytest.mark.parametrize("lora,flag", [(True, "mcore_adapter"), (False, "mcore_model")])
def test_megatron_discovery_to_resume_arguments(tmp_path, lora, flag):
    from launcher.nodeprog.checkpoints import find_latest_complete
    from .test_checkpoints import plant_megatron   # ms-swift 4.6's save layout, file:line named there
    plant_megatron(tmp_path, "v0-20260101-000000", 100, lora=lora)
    plant_megatron(tmp_path, "v1-20260102-000000", 200, lora=lora)
    plant_megatron(tmp_path, "v1-20260102-000000", 300, lora=lora, done=False)   # killed mid-save
    data = swift_megatron()
    data["output_dir"] = str(tmp_path)
    if not lora:
        data["finetuning"] = {"type": "full"}
    job = validate(data)
    found = find_latest_complete(str(tmp_path), megatron=True)
    assert found.latest == str(tmp_path / "v1-20260102-000000" / "checkpoint-200")
    run = RunContext(run_id="R", run_dir="/runs/R", resume_from=found.latest)
    f = flags(TRAINERS["swift"].entry(job, run))
    # load_mcore_checkpoint reads <dir>/latest_checkpointed_iteration.txt and <dir>/iter_0000200/.
    assert f[flag] == [found.latest] and f["finetune"] == ["false"]
    assert (tmp_path / "v1-20260102-000000" / "checkpoint-200" / "iter_0000200" / "metadata.json").exists()

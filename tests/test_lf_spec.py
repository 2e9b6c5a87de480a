"""LLaMA-Factory beyond sft/pt: stages, trackers, FSDP, OFT/QLoRA variants, launch variables,
--resume PATH and `render --resume/--overwrite`. Each refusal is one line, asserted by its text.
"""
from __future__ import annotations

import json
import os

import pytest
import yaml

from launcher.errors import SpecError
from launcher.plan.launch_plan import build_plan
from launcher.spec import validate

from .helpers import mlaunch, seed000, write_spec
from .test_resume_guard import checkpoint, lf_job


def spec(**changes) -> dict:
    """seed 000 (4 nodes x 4 GPUs, LoRA, ZeRO-2) with top-level fields replaced (None: removed)."""
    data = seed000()
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def problems(data: dict) -> list[str]:
    with pytest.raises(SpecError) as err:
        validate(data)
    return [str(p) for p in err.value.problems]


def rendered(data: dict, **plan_kw) -> tuple[dict, object]:
    plan = build_plan(validate(data), run_id="run-1", **plan_kw)
    text = next(f.content for f in plan.files if f.path.endswith("llamafactory.yaml"))
    return yaml.safe_load(text), plan


LORA = {"type": "lora", "lora_rank": 8, "lora_alpha": 16}
NO_DS = {"deepspeed": None}
REFUSALS = [
    (dict(cluster={**seed000()["cluster"], "env": {"USE_RAY": "1"}}),
     "cluster.env.USE_RAY: LLaMA-Factory would start Ray on every rank instead of training under "
     "mlaunch's torchrun; for a Ray cluster set cluster.scheduler: ray and cluster.ray: {address: "
     "..., nodes: N} (mlaunch places one bundle per node and runs torchrun in each); remove it"),
    (dict(cluster={**seed000()["cluster"], "env": {"RDZV_ID": "x"}}),
     "cluster.env.RDZV_ID: it switches llamafactory-cli to an elastic torchrun of its own"),
    (dict(cluster={**seed000()["cluster"], "env": {"MIN_NNODES": "1"}}),
     "cluster.env.MIN_NNODES: elastic node counts belong to llamafactory-cli's own torchrun"),
    (dict(cluster={**seed000()["cluster"], "env": {"MAX_NNODES": "8"}}),
     "cluster.env.MAX_NNODES: elastic node counts belong to llamafactory-cli's own torchrun"),
    (dict(cluster={**seed000()["cluster"], "env": {"FORCE_TORCHRUN": "1"}}),
     "cluster.env.FORCE_TORCHRUN: it makes llamafactory-cli start a torchrun of its own"),
    (dict(cluster={**seed000()["cluster"], "env": {"NNODES": "4"}}),
     "cluster.env.NNODES: set by mlaunch from cluster.hosts; remove it (mlaunch's torchrun sets it "
     "per node; a trainer's own launcher reading it would start torchrun again)"),
    (dict(cluster={**seed000()["cluster"], "env": {"NODE_RANK": "0"}}),
     "cluster.env.NODE_RANK: set by mlaunch from the node order in cluster.hosts"),
    (dict(cluster={**seed000()["cluster"], "env": {"NPROC_PER_NODE": "4"}}),
     "cluster.env.NPROC_PER_NODE: set by mlaunch from cluster.gpus_per_node"),
    (dict(fsdp={"sharding": "full_shard"}),
     "fsdp: give deepspeed or fsdp, not both: they are two ways to shard one model and the Trainer "
     "would take DeepSpeed; remove one section"),
    (dict(template=None), "template: required for stage sft (LLaMA-Factory formats the prompts with it"),
    (dict(preference={"beta": 0.2}), "preference: only applies to stage dpo or kto (stage is sft); remove it"),
    (dict(stage="kto", preference={"loss": "ipo"}), "preference.loss: only applies to stage dpo (stage is kto)"),
    (dict(stage="dpo", preference={"kto_chosen_weight": 2.0}),
     "preference.kto_chosen_weight: only applies to stage kto (stage is dpo)"),
    (dict(stage="dpo", preference={"loss": "ipo", "label_smoothing": 0.1}),
     "preference.label_smoothing: only valid with loss sigmoid (loss is ipo)"),
    (dict(stage="dpo", preference={"loss": "orpo", "ref_model": "/m"}),
     "preference.ref_model: loss orpo uses no reference model; remove ref_model"),
    (dict(stage="rm", finetuning={"type": "full"}, max_restarts=2),
     "max_restarts: LLaMA-Factory cannot resume stage rm with type full"),
    (dict(stage="ppo"), "stage: 'ppo' is not one of sft, pt, dpo, kto, rm"),
    (dict(stage="dpo", finetuning={**LORA, "pissa_init": True}),
     "finetuning.pissa_init: LLaMA-Factory cannot use PiSSA with stage dpo"),
    (dict(finetuning={**LORA, "quantization_bit": 2}),
     "finetuning.quantization_bit: 2 is not one of 4, 8 for quantization_method bnb "
     "(hqq: 1, 2, 3, 4, 5, 6, 8; eetq: 8)"),
    (dict(finetuning={**LORA, "quantization_bit": 4, "quantization_method": "eetq"}),
     "finetuning.quantization_bit: 4 is not one of 8 for quantization_method eetq"),
    (dict(finetuning={"type": "full", "use_dora": True}),
     "finetuning.use_dora: only applies to type lora, but type is full; remove it"),
    (dict(finetuning={"type": "freeze", "quantization_bit": 4}),
     "finetuning.quantization_bit: only applies to type lora or oft, but type is freeze"),
    (dict(finetuning={"type": "lora", "oft_rank": 4}), "finetuning.oft_rank: only applies to type oft"),
    (dict(deepspeed={"stage": 3}, finetuning={**LORA, "quantization_bit": 8, "quantization_method": "hqq"}),
     "finetuning.quantization_method: hqq quantization cannot be combined with ZeRO-3"),
    (dict(**NO_DS, fsdp={}, finetuning={**LORA, "quantization_bit": 8}),
     "finetuning.quantization_bit: 8-bit cannot be combined with FSDP: only bnb 4-bit can"),
    (dict(passthrough={"use_galore": True, "galore_layerwise": True}, finetuning={"type": "full"}, **NO_DS),
     "passthrough.galore_layerwise: LLaMA-Factory refuses layer-wise GaLore in distributed runs (16 processes)"),
    (dict(passthrough={"use_galore": True}, finetuning={"type": "full"}),
     "passthrough.use_galore: GaLore and APOLLO do not work with DeepSpeed"),
    (dict(passthrough={"use_badam": True, "badam_mode": "ratio"}, finetuning={"type": "full"}),
     "passthrough.badam_mode: ratio-based BAdam does not run distributed"),
    (dict(passthrough={"use_badam": True}, finetuning={"type": "full"}),
     "passthrough.use_badam: layer-wise BAdam runs distributed only under ZeRO-3"),
    (dict(stage="pt", passthrough={"train_on_prompt": True}),
     "passthrough.train_on_prompt: only valid for stage sft (stage is pt)"),
    (dict(passthrough={"ray_num_workers": 4, "ray_init_kwargs": {}}),
     "passthrough.ray_num_workers: LLaMA-Factory's own Ray mode would start a Ray job on every rank; "
     "set cluster.scheduler: ray and cluster.ray: {address: ..., nodes: N} (mlaunch places one bundle "
     "per node and runs torchrun in each), and remove ray_num_workers, ray_init_kwargs "
     "(ray_num_workers -> cluster.ray.nodes × cluster.gpus_per_node; ray_init_kwargs -> cluster.ray.address)"),
    (dict(passthrough={"report_to": "wandb"}), "passthrough.report_to: mlaunch owns this key; set report_to instead"),
    (dict(passthrough={"ddp_timeout": 10}), "passthrough.ddp_timeout: mlaunch owns this key; set training.ddp_timeout"),
    (dict(passthrough={"pref_beta": 0.2}), "passthrough.pref_beta: mlaunch owns this key; set preference.beta"),
    (dict(report_to="comet"), "report_to: 'comet' is not one of none, tensorboard, wandb, mlflow, swanlab"),
]


@pytest.mark.parametrize("changes,expected", REFUSALS, ids=[e.split(":")[0] + f"-{i}" for i, (_, e) in enumerate(REFUSALS)])
def test_each_refusal_is_one_line(changes, expected):
    lines = problems(spec(**changes))
    hits = [line for line in lines if line.startswith(expected)]
    assert len(hits) == 1, lines


def test_stages_render_their_keys():
    got, _ = rendered(spec(stage="dpo", preference={"beta": 0.2, "loss": "simpo", "simpo_gamma": 1.0}))
    assert (got["stage"], got["pref_beta"], got["pref_loss"], got["simpo_gamma"]) == ("dpo", 0.2, "simpo", 1.0)
    got, _ = rendered(spec(stage="kto", preference={"kto_rejected_weight": 1.5}))
    assert (got["pref_beta"], got["kto_rejected_weight"]) == (0.1, 1.5) and "pref_loss" not in got
    got, _ = rendered(spec(stage="rm"))
    assert got["stage"] == "rm" and "pref_beta" not in got
    got, _ = rendered(spec(stage="pt", template=None))
    assert "template" not in got
    got, _ = rendered(spec(stage="dpo", preference={"ref_model": "/models/ref", "ref_model_quantization_bit": 4}))
    assert (got["ref_model"], got["ref_model_quantization_bit"], got["pref_loss"]) == ("/models/ref", 4, "sigmoid")


def test_tracking_ddp_timeout_and_launch_env():
    data = spec(report_to="wandb")
    data["training"]["ddp_timeout"] = 1800
    data["cluster"]["env"].update(WANDB_API_KEY="wandb-secret-123", PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:128")
    got, plan = rendered(data)
    assert (got["report_to"], got["run_name"], got["ddp_timeout"]) == ("wandb", "run-1", 1800)
    env = dict(plan.nodes[0].env)
    assert env["TORCH_NCCL_AVOID_RECORD_STREAMS"] == "1"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"   # cluster.env wins
    assert "wandb-secret-123" not in plan.nodes[0].display and "export WANDB_API_KEY='***'" in plan.nodes[0].display
    got, plan = rendered(spec())
    assert (got["report_to"], got["ddp_timeout"]) == ("none", 7200) and "run_name" not in got
    assert dict(plan.nodes[0].env)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_fsdp_and_finetuning_variants_render():
    got, plan = rendered(spec(deepspeed=None, fsdp={"sharding": "hybrid_shard", "offload": True,
                                                     "layer_cls": ["Qwen2DecoderLayer"]}))
    assert got["fsdp"] == "hybrid_shard auto_wrap offload" and "deepspeed" not in got
    assert got["fsdp_config"] == {"use_orig_params": True, "transformer_layer_cls_to_wrap": ["Qwen2DecoderLayer"]}
    assert not any(f.path.endswith("ds_config.json") for f in plan.files)
    got, _ = rendered(spec(finetuning={"type": "oft", "oft_block_size": 16, "additional_target": ["lm_head"],
                                       "quantization_bit": 3, "quantization_method": "hqq"}))
    assert (got["finetuning_type"], got["oft_block_size"], got["oft_target"]) == ("oft", 16, "all")
    assert (got["additional_target"], got["quantization_bit"], got["quantization_method"]) == ("lm_head", 3, "hqq")
    assert "lora_rank" not in got
    got, _ = rendered(spec(finetuning={**LORA, "use_dora": True, "use_rslora": True, "pissa_init": True}))
    assert got["use_dora"] is got["use_rslora"] is got["pissa_init"] is True


def test_swift_refuses_what_only_llamafactory_renders():
    data = {"name": "s", "trainer": "swift", "cluster": {"hosts": ["a"], "gpus_per_node": 1}, "model": "/m",
            "dataset": "d", "finetuning": {"type": "oft"}, "batch": {"per_device": 1},
            "training": {"learning_rate": 1e-4, "max_steps": 1}, "output_dir": "/o"}
    assert "finetuning.type: oft is rendered for trainer llamafactory only; use lora, freeze or full" in problems(data)
    data["finetuning"] = {"type": "lora", "use_dora": True}
    assert any(p.startswith("finetuning.use_dora: rendered for trainer llamafactory only") for p in problems(data))
    # training.ddp_timeout reaches ms-swift's HF Trainer when given; Megatron-SWIFT refuses it.
    data["finetuning"], data["training"]["ddp_timeout"] = {"type": "lora"}, 600
    argv = build_plan(validate(data)).nodes[0].argv
    assert argv[argv.index("--ddp_timeout") + 1] == "600"
    data["megatron"] = {"tp": 1}
    assert problems(data) == ["training.ddp_timeout: not rendered for Megatron-SWIFT; give its "
                              "distributed_timeout_minutes in passthrough instead"]


# ---- --resume PATH and render --resume/--overwrite (fake torchrun records the YAML) ----

def test_resume_path_is_checked_then_used(tmp_path):
    out = tmp_path / "out"
    checkpoint(out, 5)
    checkpoint(out, 10, complete=False)
    other = tmp_path / "elsewhere"
    checkpoint(other, 3)
    job = write_spec(tmp_path, lf_job(tmp_path, str(out)))
    r = mlaunch("submit", job, f"--resume={out}/checkpoint-10", "--no-preflight")
    assert r.returncode == 2 and not (tmp_path / "seen.yaml").exists()
    assert (f"mlaunch: --resume {out}/checkpoint-10: no trainer_state.json (interrupted save?) on node0 "
            f"localhost; give a complete checkpoint, or --resume to take the latest complete one in {out}") in r.stderr
    r = mlaunch("submit", job, f"--resume={tmp_path}/nowhere", "--no-preflight")
    assert r.returncode == 2 and f"--resume {tmp_path}/nowhere: no such directory on node0 localhost;" in r.stderr
    r = mlaunch("submit", job, f"--resume={other}/checkpoint-3", "--no-preflight")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resuming from {other}/checkpoint-3 (--resume PATH)" in r.stdout
    seen = yaml.safe_load((tmp_path / "seen.yaml").read_text())
    assert seen["resume_from_checkpoint"] == f"{other}/checkpoint-3" and seen["overwrite_output_dir"] is False


def test_resume_refused_where_llamafactory_ignores_it(tmp_path):
    out = tmp_path / "out"
    checkpoint(out, 5)
    job = dict(lf_job(tmp_path, str(out)), stage="rm", finetuning={"type": "full"})
    r = mlaunch("submit", write_spec(tmp_path, job), "--resume", "--no-preflight")
    assert r.returncode == 2 and not (tmp_path / "seen.yaml").exists()
    assert ("mlaunch: --resume: LLaMA-Factory cannot resume stage rm with type full (it drops "
            "resume_from_checkpoint and starts over); use --overwrite to start fresh") in r.stderr


def test_render_resume_and_overwrite(tmp_path):
    out = tmp_path / "out"
    checkpoint(out, 5)
    checkpoint(out, 10, complete=False)
    job = write_spec(tmp_path, lf_job(tmp_path, str(out)))
    absent = dict(yaml.safe_load(open(job)), output_dir=str(tmp_path / "absent"))

    def render(*flags):
        d = tmp_path / f"r{len(os.listdir(tmp_path))}"
        r = mlaunch("render", job, "--out", str(d), *flags)
        return r, (yaml.safe_load((d / "llamafactory.yaml").read_text()) if r.returncode == 0 else None)

    r, got = render("--resume")
    assert r.returncode == 0 and got["resume_from_checkpoint"] == f"{out}/checkpoint-5", r.stderr
    r, got = render("--overwrite")
    assert got["overwrite_output_dir"] is True and "resume_from_checkpoint" not in got
    r, got = render(f"--resume={out}/checkpoint-10")
    assert r.returncode == 2 and f"mlaunch: --resume {out}/checkpoint-10: no trainer_state.json" in r.stderr
    r, _ = render("--resume", "--overwrite")
    assert r.returncode == 2 and "mlaunch: --resume and --overwrite contradict each other; pick one" in r.stderr
    gone = write_spec(tmp_path, absent, "absent.yaml")
    r = mlaunch("render", gone, "--out", str(tmp_path / "rx"), "--resume")
    assert r.returncode == 2 and (f"mlaunch: render --resume looks only at this machine, and output_dir "
                                  f"{tmp_path}/absent is not here; give --resume PATH") in r.stderr
    r = mlaunch("submit", job, "--dry-run", f"--resume={out}/checkpoint-5")
    assert r.returncode == 0 and f"resume from: {out}/checkpoint-5" in r.stdout
    assert f'resume_from_checkpoint: "{out}/checkpoint-5"' in r.stdout
    assert json.loads((out / "checkpoint-5" / "trainer_state.json").read_text())["global_step"] == 5


def test_ppo_is_refused_with_why_and_the_way_out(tmp_path):
    # LLaMA-Factory 0.9.5 itself: ppo/trainer.py checks trl<=0.9.6, extras/misc.py trl>=0.18.
    assert problems(spec(stage="ppo")) == [
        "stage: 'ppo' is not one of sft, pt, dpo, kto, rm: LLaMA-Factory 0.9.5's PPO trainer needs "
        "trl 0.8.6-0.9.6 while the rest of 0.9.5 needs trl >= 0.18 (both are its own version "
        "checks), so no one install runs it; for PPO use trainer: swift with stage: rlhf, "
        "rlhf_type: ppo and its reward_model in passthrough"]
    r = mlaunch("validate", write_spec(tmp_path, spec(stage="ppo")))
    assert r.returncode == 2 and r.stderr.count("\n") == 2 and "rlhf_type: ppo" in r.stderr

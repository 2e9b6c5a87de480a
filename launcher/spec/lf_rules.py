"""LLaMA-Factory 0.9.5's own rules, checked before launch instead of on every rank at start.

Most come from llamafactory/hparams/parser.py (get_train_args) and finetuning_args.py
(FinetuningArguments.__post_init__); the world-size ones are those LLaMA-Factory applies
only when it runs distributed, which mlaunch knows from the cluster block.
"""
from __future__ import annotations

from ..errors import Problem
from .ds_rules import zero_of
from .lf_optim_rules import check_optimizers
from .models import LlamaFactoryJob
from .rules import check_restarts
from .select import world_size

# Stages whose datasets must be pairwise rankings (LLaMA-Factory loads DPO data as "rm").
RANKING_STAGES = ("dpo", "rm")
PREF_STAGES = ("dpo", "kto")


def check_llamafactory(job: LlamaFactoryJob) -> list[Problem]:
    """Every LLaMA-Factory-specific rule of a validated job."""
    return (_check_template(job) + _check_preference(job) + _check_stage(job) + _check_fsdp(job)
            + _check_quant_sharding(job) + _check_distributed(job) + _check_ray(job)
            + check_optimizers(job) + _check_dataset_form(job) + _check_resumable(job))


def _check_dataset_form(job: LlamaFactoryJob) -> list[Problem]:
    """A dataset of the wrong form for the stage (an SFT set for dpo, a ranking set for sft):
    LLaMA-Factory's own refusal ("not applicable in the current training stage"), which
    preflight makes on node 0; here already when dataset_dir's dataset_info.json is on this
    machine (the quickstart's, a shared mount), so validate says it too."""
    import json
    import os
    from ..nodeprog.inputs import form_error
    info = os.path.join(job.dataset_dir, "dataset_info.json") if job.dataset_dir else None
    if not info or not os.path.isfile(info):
        return []
    try:
        with open(info, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return []   # preflight says what is wrong with the file, on the node that reads it
    names = [job.dataset] if isinstance(job.dataset, str) else list(job.dataset)
    out = []
    for name in (n.strip() for n in names):
        entry = data.get(name) if isinstance(data, dict) else None
        why = form_error(entry, job.stage) if isinstance(entry, dict) else None
        if why:
            out.append(Problem("dataset", f"{name}: {why} ({info}); pick a dataset of that form, or "
                               f"the stage its form trains"))
    return out


def _check_template(job: LlamaFactoryJob) -> list[Problem]:
    if job.template is None and job.stage != "pt":
        return [Problem("template", f"required for stage {job.stage} (LLaMA-Factory formats the "
                        "prompts with it, e.g. qwen); only stage pt may omit it")]
    from . import known_args
    return known_args.check_template("llamafactory", job.template,
                                     f"LLaMA-Factory {known_args.version('llamafactory')}")


def _check_preference(job: LlamaFactoryJob) -> list[Problem]:
    """The preference section belongs to dpo/kto, and each knob to its own loss."""
    pref = job.preference
    if pref is None:
        return []
    if job.stage not in PREF_STAGES:
        return [Problem("preference", f"only applies to stage dpo or kto (stage is {job.stage}); "
                        "remove it")]
    p: list[Problem] = []
    only = {"dpo": ("loss", "label_smoothing", "simpo_gamma"),
            "kto": ("kto_chosen_weight", "kto_rejected_weight")}
    for stage, names in only.items():
        for name in sorted(set(names) & pref.model_fields_set):
            if job.stage != stage:
                p.append(Problem(f"preference.{name}", f"only applies to stage {stage} (stage is "
                                 f"{job.stage}); remove it"))
    if job.stage == "dpo" and pref.label_smoothing > 0 and pref.loss != "sigmoid":
        p.append(Problem("preference.label_smoothing", f"only valid with loss sigmoid (loss is "
                         f"{pref.loss}); remove it or use loss sigmoid"))
    if job.stage == "dpo" and "simpo_gamma" in pref.model_fields_set and pref.loss != "simpo":
        p.append(Problem("preference.simpo_gamma", f"only used by loss simpo (loss is {pref.loss})"))
    if job.stage == "dpo" and pref.loss in ("orpo", "simpo") and pref.ref_model:
        p.append(Problem("preference.ref_model", f"loss {pref.loss} uses no reference model; "
                         "remove ref_model"))
    return p


def _check_stage(job: LlamaFactoryJob) -> list[Problem]:
    """Stage-specific limits of LLaMA-Factory and trl."""
    p: list[Problem] = []
    f, pt = job.finetuning, job.passthrough
    ref = job.stage == "dpo" and (job.preference is None or job.preference.loss not in ("orpo", "simpo"))
    if f.pissa_init and (job.stage == "kto" or ref):
        p.append(Problem("finetuning.pissa_init", f"LLaMA-Factory cannot use PiSSA with stage "
                         f"{job.stage} (it needs the unmodified base as reference); remove it"))
    if job.stage == "rm" and f.type in ("full", "freeze") and job.max_restarts:
        p.append(Problem("max_restarts", f"LLaMA-Factory cannot resume stage rm with type {f.type} "
                         "(it drops resume_from_checkpoint), so a restart would start over; set "
                         "max_restarts to 0 or use lora"))
    if job.stage == "rm" and pt.get("load_best_model_at_end"):
        p.append(Problem("passthrough.load_best_model_at_end", "not supported by stage rm; remove it"))
    if job.stage != "sft":
        for key in ("predict_with_generate", "neat_packing", "train_on_prompt", "mask_history"):
            if pt.get(key):
                p.append(Problem(f"passthrough.{key}", f"only valid for stage sft (stage is "
                                 f"{job.stage}); remove it"))
    return p


def not_resumable(job: LlamaFactoryJob) -> str | None:
    """Why no checkpoint of this job can be resumed: the Trainer's save_only_model writes the
    weights and trainer_state.json only, and a resume from that silently starts a fresh
    optimizer and LR schedule at the saved step (with DeepSpeed, no checkpoint loads at all)."""
    if job.passthrough.get("save_only_model") is True:
        return ("passthrough save_only_model: true saves no optimizer, scheduler or RNG state "
                "(and no DeepSpeed engine state): a resume would go on with a fresh optimizer and "
                "the LR schedule restarted")
    return None


def _check_resumable(job: LlamaFactoryJob) -> list[Problem]:
    """Restarts that could only go on with another optimizer state are refused, with the reason."""
    return check_restarts(job, not_resumable(job))


def resume_refusal(job) -> str | None:
    """Why --resume cannot work for this job (LLaMA-Factory ignores the checkpoint), or None."""
    if isinstance(job, LlamaFactoryJob) and job.stage == "rm" and job.finetuning.type in ("full", "freeze"):
        return (f"--resume: LLaMA-Factory cannot resume stage rm with type {job.finetuning.type} (it "
                "drops resume_from_checkpoint and starts over); use --overwrite to start fresh")
    return None


def _check_fsdp(job: LlamaFactoryJob) -> list[Problem]:
    if job.fsdp is None:
        return []
    if job.deepspeed is not None:
        return [Problem("fsdp", "give deepspeed or fsdp, not both: they are two ways to shard one "
                        "model and the Trainer would take DeepSpeed; remove one section")]
    return []


def _check_quant_sharding(job: LlamaFactoryJob) -> list[Problem]:
    """Which quantized models can be sharded (LLaMA-Factory's quantization.py)."""
    f = job.finetuning
    zero3 = zero_of(job)[0] == 3   # the spec's stage, or the user file's
    if not f.quantization_bit or not (zero3 or job.fsdp):
        return []
    how = "ZeRO-3" if zero3 else "FSDP"
    if f.quantization_method in ("hqq", "eetq"):
        return [Problem("finetuning.quantization_method", f"{f.quantization_method} quantization "
                        f"cannot be combined with {how}; use bnb, or no {how}")]
    if job.fsdp and f.quantization_bit != 4:
        return [Problem("finetuning.quantization_bit", f"{f.quantization_bit}-bit cannot be combined "
                        "with FSDP: only bnb 4-bit can (FSDP+QLoRA); use 4")]
    if f.quantization_bit != 4:
        return [Problem("finetuning.quantization_bit", f"{f.quantization_bit}-bit cannot be combined "
                        "with ZeRO-3: only bnb 4-bit can (QLoRA under ZeRO-3); use 4, or deepspeed "
                        "stage 0-2")]
    return []


def _check_distributed(job: LlamaFactoryJob) -> list[Problem]:
    """Rules LLaMA-Factory applies only to distributed runs, and its optimizer exclusions."""
    procs = world_size(job)
    pt, p = job.passthrough, []
    zero3 = zero_of(job)[0] == 3   # the spec's stage, or the user file's
    if procs > 1:
        for method, name in (("galore", "GaLore"), ("apollo", "APOLLO")):
            if pt.get(f"use_{method}") and pt.get(f"{method}_layerwise"):
                p.append(Problem(f"passthrough.{method}_layerwise", f"LLaMA-Factory refuses layer-wise "
                                 f"{name} in distributed runs ({procs} processes); remove it "
                                 "or run 1 process"))
        if pt.get("use_badam") and pt.get("badam_mode", "layer") == "ratio":
            p.append(Problem("passthrough.badam_mode", "ratio-based BAdam does not run distributed; use "
                             "badam_mode layer (with deepspeed stage 3)"))
        elif pt.get("use_badam") and not zero3:
            p.append(Problem("passthrough.use_badam", "layer-wise BAdam runs distributed only under "
                             "ZeRO-3; set deepspeed: {stage: 3}"))
    if job.deepspeed is not None and (pt.get("use_galore") or pt.get("use_apollo")):
        p.append(Problem("passthrough.use_galore" if pt.get("use_galore") else "passthrough.use_apollo",
                         "GaLore and APOLLO do not work with DeepSpeed; remove the deepspeed section"))
    if zero3 and job.finetuning.pissa_init:
        p.append(Problem("finetuning.pissa_init", "cannot be initialised under ZeRO-3; run "
                         "LLaMA-Factory's scripts/pissa_init.py first and load the result"))
    if zero3 and pt.get("pure_bf16"):
        p.append(Problem("passthrough.pure_bf16", "incompatible with ZeRO-3; remove it"))
    if zero3 and pt.get("use_unsloth"):
        p.append(Problem("passthrough.use_unsloth", "Unsloth is incompatible with ZeRO-3"))
    return p


def _check_ray(job: LlamaFactoryJob) -> list[Problem]:
    """LLaMA-Factory's RayArguments (its own Ray job would start its own workers): one line
    saying what to write instead (ray_rules.py)."""
    from .ray_rules import lf_ray_keys
    return lf_ray_keys(job.passthrough)

"""Cross-field rules of `trainer: swift` jobs: ms-swift's own, and Megatron's arithmetic."""
from __future__ import annotations

import re

from ..errors import Problem
from .models import SwiftJob
from . import known_args
from .models import MEGATRON_RLHF_TYPES, RLHF_TYPES
from .rules import USE_CPU_WHY, check_batch, check_deepspeed, check_finetuning, check_restarts, check_training
from .secret_rules import check_passthrough_secrets, secret_name
from .owned import SWIFT_OWNED  # noqa: F401  (importable from here)
from .model_config import MEGATRON_SCHEDULERS, config_int, divisors, model_config  # noqa: F401  (importable from here)


DDP_NOT_DEEPSPEED = ("mlaunch renders the DeepSpeed config; use `deepspeed: {stage: N}`. For plain "
                     "DDP leave deepspeed out entirely: passing --deepspeed (as seed 003's DDP "
                     "example does with `--deepspeed zero2`) runs DeepSpeed ZeRO, not DDP")



def check_swift(job: SwiftJob) -> list[Problem]:
    """ms-swift: the shared LLaMA-Factory-style rules plus swift's own and Megatron's arithmetic."""
    from .megatron_rules import check_megatron  # it imports this module's helpers
    p = check_stage(job) + check_finetuning(job) + check_deepspeed(job) + check_training(job)
    if job.megatron:
        p += check_megatron(job)
    else:
        p += check_batch(job)
    p += _check_swift_freeze(job) + _check_lf_only(job) + check_swift_passthrough(job) + check_resumable(job)
    if not {"custom_register_path", "external_plugins"} & set(job.passthrough):   # they may register templates
        p += known_args.check_template("swift", job.template, f"ms-swift {known_args.version('swift')}")
    from .swift_start_rules import check_swift_start
    return p + check_swift_start(job)


# Finetuning knobs mlaunch renders for LLaMA-Factory only.
LF_ONLY = ("use_dora", "use_rslora", "pissa_init", "additional_target", "oft_rank", "oft_block_size",
           "oft_target", "quantization_method")


def _check_lf_only(job: SwiftJob) -> list[Problem]:
    """OFT and the LoRA variants are rendered for LLaMA-Factory; refuse them here, not drop them."""
    f = job.finetuning
    p = [Problem("finetuning.type", "oft is rendered for trainer llamafactory only; use lora, "
                 "freeze or full")] if f.type == "oft" else []
    p += [Problem(f"finetuning.{name}", "rendered for trainer llamafactory only; remove it (or give "
                  "the ms-swift argument in passthrough)") for name in LF_ONLY if name in f.model_fields_set]
    if job.megatron and "ddp_timeout" in job.training.model_fields_set:
        p.append(Problem("training.ddp_timeout", "not rendered for Megatron-SWIFT; give its "
                         "distributed_timeout_minutes in passthrough instead"))
    return p


def entry_name(job: SwiftJob) -> str:
    """The entry point's key in known_args.json: swift.sft, megatron.rlhf, ..."""
    return ("megatron." if job.megatron else "swift.") + job.stage


def check_stage(job: SwiftJob) -> list[Problem]:
    """rlhf_type goes with stage rlhf, and Megatron-SWIFT's rlhf takes fewer types."""
    if job.stage == "rlhf" and job.rlhf_type is None:
        return [Problem("rlhf_type", f"required with stage rlhf: one of {', '.join(RLHF_TYPES)}")]
    if job.stage != "rlhf" and job.rlhf_type is not None:
        return [Problem("rlhf_type", f"only applies to stage rlhf, but stage is {job.stage}; "
                        "set stage: rlhf or remove it")]
    if job.megatron and job.rlhf_type and job.rlhf_type not in MEGATRON_RLHF_TYPES:
        return [Problem("rlhf_type", f"Megatron-SWIFT's rlhf takes {', '.join(MEGATRON_RLHF_TYPES)}, "
                        f"not {job.rlhf_type}; choose one of those or drop the megatron section")]
    return []


def not_resumable(job: SwiftJob) -> str | None:
    """Why this job's checkpoints cannot be resumed (a passthrough that drops optimizer state)."""
    pt = job.passthrough
    if job.megatron and pt.get("no_save_optim") is True:
        return ("passthrough no_save_optim: true saves no optimizer state (and with safetensors no "
                "Megatron weights), so no checkpoint can be resumed")
    if not job.megatron and pt.get("save_only_model") is True:
        return ("passthrough save_only_model: true saves no optimizer, scheduler or RNG state "
                "(and no DeepSpeed engine state), so no checkpoint can be resumed")
    return None


def check_resumable(job: SwiftJob) -> list[Problem]:
    """Restarts that can only start over are refused, with the reason."""
    return check_restarts(job, not_resumable(job))


def _check_swift_freeze(job: SwiftJob) -> list[Problem]:
    """freeze maps to swift's full tuner with only the chosen layers trainable (needs the layer count)."""
    f = job.finetuning
    if f.type != "freeze" or job.megatron:
        return []
    if f.freeze_trainable_layers == 0:
        return [Problem("finetuning.freeze_trainable_layers", "0 trains no layer; give N (last N "
                        "layers) or -N (first N layers)")]
    if f.freeze_trainable_layers > 0 and config_int(model_config(job.model), "num_hidden_layers") is None:
        return [Problem("finetuning.freeze_trainable_layers",
                        f"swift selects trainable layers by index, and the last {f.freeze_trainable_layers} "
                        f"need the layer count, but {job.model}/config.json is not readable here; "
                        "use a negative count (first layers), or run mlaunch where the model is")]
    return []


def check_swift_passthrough(job: SwiftJob) -> list[Problem]:
    """Extra swift arguments: names the entry point accepts, none that mlaunch renders."""
    p: list[Problem] = []
    if job.cluster.env.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        p.append(Problem("cluster.env.ACCELERATE_USE_CPU", USE_CPU_WHY))
    p += check_passthrough_secrets(job.passthrough, "ms-swift")
    free = []
    for key, value in job.passthrough.items():
        line = None if secret_name(key) else _passthrough_problem(job, key, value)
        if line:
            p.append(Problem(f"passthrough.{key}", line))
        elif not (key == "finetune" and value is True) and not secret_name(key):
            free.append(key)
    where = f"ms-swift {known_args.version('swift')} `{entry_name(job).replace('.', ' ')}`"
    return p + known_args.check("swift", entry_name(job), free, where)


def _passthrough_problem(job: SwiftJob, key: str, value) -> str | None:
    """What is wrong with one passthrough key, or None."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return "not an ms-swift argument name (give it without the leading --)"
    if key == "deepspeed":
        return DDP_NOT_DEEPSPEED
    if key == "train_type":
        return "ms-swift 4.x rejects --train_type (renamed --tuner_type); set finetuning.type instead"
    if key == "use_cpu":
        return USE_CPU_WHY
    if key == "use_ray":
        from .ray_rules import SWIFT_USE_RAY
        return SWIFT_USE_RAY
    if key == "rlhf_type":
        return (f"`swift {job.stage}` has no --rlhf_type, so every node would stop at start; set "
                f"stage: rlhf and rlhf_type: {value} instead")
    if key == "finetune" and job.megatron and value is True:
        return None   # Megatron-SWIFT's default; a note says so, nothing is rendered
    if key == "finetune" and job.megatron:
        return ("false continues a Megatron checkpoint's iteration and optimizer, which mlaunch "
                "renders itself when resuming; use --resume (or max_restarts) instead")
    if key in SWIFT_OWNED and not (key == "finetune" and not job.megatron):
        return f"mlaunch owns this argument; set {SWIFT_OWNED[key]} instead"
    if value is None or value == "" or value == []:
        return "empty value; give a value or remove the key"
    return None


def rendered_passthrough(job: SwiftJob) -> dict:
    """The passthrough arguments rendered after mlaunch's own (finetune true is the default)."""
    return {k: v for k, v in job.passthrough.items() if not (k == "finetune" and v is True)}


def swift_notes(job: SwiftJob) -> list[str]:
    """Dry-run lines for settings ms-swift accepts but changes or ignores."""
    notes = []
    if job.passthrough.get("finetune") is True:
        notes.append("passthrough finetune: true is Megatron-SWIFT's default (load weights only; "
                     "a resume renders --finetune false); not rendered")
    m = job.megatron
    if m and m.sequence_parallel and m.tp == 1:
        notes.append("megatron.sequence_parallel with tp 1: ms-swift turns it off "
                     "(megatron_args.py: sequence_parallel needs tp > 1); no effect")
    return notes

"""Cross-field rules of `trainer: swift` jobs: ms-swift's own, and Megatron's arithmetic."""
from __future__ import annotations

import json
import os
import re

from ..errors import Problem
from .models import SwiftJob
from .rules import (USE_CPU_WHY, check_batch, check_deepspeed, check_finetuning,
                    check_training, world_size, world_text)

# ms-swift arguments that mlaunch renders from the spec (HF-Trainer mode and Megatron-SWIFT
# mode), with the field that owns each. A passthrough key may not collide with these.
SWIFT_OWNED = {
    "model": "model", "model_type": "model_type", "template": "template", "dataset": "dataset",
    "max_length": "max_length", "tuner_type": "finetuning.type", "train_type": "finetuning.type",
    "lora_rank": "finetuning.lora_rank", "lora_alpha": "finetuning.lora_alpha",
    "lora_dropout": "finetuning.lora_dropout", "target_modules": "finetuning.lora_target",
    "quant_method": "finetuning.quantization_bit", "quant_bits": "finetuning.quantization_bit",
    "freeze_parameters_ratio": "finetuning.freeze_trainable_layers",
    "trainable_parameters_regex": "finetuning.freeze_trainable_layers/freeze_trainable_modules",
    "per_device_train_batch_size": "batch.per_device",
    "gradient_accumulation_steps": "batch.grad_accum", "micro_batch_size": "batch.per_device",
    "global_batch_size": "batch.global", "torch_dtype": "precision", "bf16": "precision",
    "fp16": "precision", "deepspeed": "deepspeed", "output_dir": "output_dir",
    "check_model": "mlaunch (false for local models)",
    "resume_from_checkpoint": "--resume", "mcore_model": "--resume", "mcore_adapter": "--resume",
    "finetune": "--resume", "learning_rate": "training.learning_rate", "lr": "training.learning_rate",
    "num_train_epochs": "training.epochs", "max_steps": "training.max_steps",
    "train_iters": "training.max_steps", "lr_scheduler_type": "training.lr_scheduler",
    "lr_decay_style": "training.lr_scheduler", "warmup_ratio": "training.warmup_ratio",
    "lr_warmup_fraction": "training.warmup_ratio", "warmup_steps": "training.warmup_steps",
    "lr_warmup_iters": "training.warmup_steps", "save_steps": "training.save_steps",
    "logging_steps": "training.logging_steps", "max_grad_norm": "training.max_grad_norm",
    "clip_grad": "training.max_grad_norm", "gradient_checkpointing": "training.gradient_checkpointing",
    "recompute_granularity": "training.gradient_checkpointing",
    "recompute_method": "training.gradient_checkpointing",
    "recompute_num_layers": "training.gradient_checkpointing", "seed": "training.seed",
    "tensor_model_parallel_size": "megatron.tp", "pipeline_model_parallel_size": "megatron.pp",
    "sequence_parallel": "megatron.sequence_parallel",
}

# Megatron's lr_decay_style for each spec scheduler it can express.
MEGATRON_SCHEDULERS = {"constant": "constant", "constant_with_warmup": "constant",
                       "linear": "linear", "cosine": "cosine",
                       "inverse_sqrt": "inverse-square-root", "warmup_stable_decay": "WSD"}

DDP_NOT_DEEPSPEED = ("mlaunch renders the DeepSpeed config; use `deepspeed: {stage: N}`. For plain "
                     "DDP leave deepspeed out entirely: passing --deepspeed (as seed 003's DDP "
                     "example does with `--deepspeed zero2`) runs DeepSpeed ZeRO, not DDP")


def model_config(model: str) -> dict | None:
    """<model>/config.json when the model is a directory readable here, else None."""
    try:
        with open(os.path.join(os.path.expanduser(model), "config.json"), encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


def config_int(cfg: dict | None, key: str) -> int | None:
    """An integer field of a HF config, also looked up in text_config (multimodal models)."""
    for c in (cfg or {}, (cfg or {}).get("text_config") or {}):
        v = c.get(key) if isinstance(c, dict) else None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def check_swift(job: SwiftJob) -> list[Problem]:
    """ms-swift: the shared LLaMA-Factory-style rules plus swift's own and Megatron's arithmetic."""
    p = check_finetuning(job) + check_deepspeed(job) + check_training(job)
    if job.megatron:
        p += check_megatron(job)
    else:
        p += check_batch(job)
    p += _check_swift_freeze(job) + check_swift_passthrough(job)
    return p


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


def check_megatron(job: SwiftJob) -> list[Problem]:
    """Megatron-SWIFT: tp x pp divides the world, pp divides the layers, sp needs tp, dp batch."""
    m = job.megatron
    p: list[Problem] = []
    size = world_size(job)
    model_par = m.tp * m.pp
    if job.deepspeed:
        p.append(Problem("deepspeed", "Megatron-SWIFT does its own parallelism and optimizer "
                         "sharding; DeepSpeed cannot be combined with megatron: remove one"))
    if size and size % model_par:
        p.append(Problem("megatron", f"tp {m.tp} × pp {m.pp} = {model_par} does not divide the world "
                         f"size {size} ({world_text(job.cluster)}), so no whole number of "
                         f"data-parallel replicas fits; choose tp × pp among {_divisors(size)}"))
    if m.sequence_parallel and m.tp == 1:
        p.append(Problem("megatron.sequence_parallel", "needs tp > 1: sequence parallelism splits "
                         "activations across the tensor-parallel group; set tp ≥ 2 or remove it"))
    cfg = model_config(job.model)
    layers = config_int(cfg, "num_hidden_layers")
    if layers and layers % m.pp:
        p.append(Problem("megatron.pp", f"the model has {layers} layers ({job.model}/config.json), "
                         f"not divisible by pp {m.pp}; choose pp among {_divisors(layers)}"))
    heads = config_int(cfg, "num_attention_heads")
    if heads and heads % m.tp:
        p.append(Problem("megatron.tp", f"the model has {heads} attention heads ({job.model}/config.json), "
                         f"not divisible by tp {m.tp}; choose tp among {_divisors(heads)}"))
    b = job.batch
    if b.global_ is not None and size and size % model_par == 0:
        dp = size // model_par
        want = dp * b.per_device * b.grad_accum
        if b.global_ != want:
            p.append(Problem("batch.global", f"{b.global_} ≠ dp {dp} × {b.per_device} per device × "
                             f"{b.grad_accum} accumulation = {want} (dp = {size} GPUs / (tp {m.tp} × "
                             f"pp {m.pp})); set global to {want}, change per_device/grad_accum, or omit global"))
    f, t = job.finetuning, job.training
    if f.type == "freeze":
        p.append(Problem("finetuning.type", "freeze is not supported by mlaunch's Megatron-SWIFT mode "
                         "(mcore parameter names differ); use lora or full"))
    if f.quantization_bit:
        p.append(Problem("finetuning.quantization_bit", "Megatron-SWIFT does not train quantized "
                         "(QLoRA) models; remove it or drop the megatron section"))
    if t.lr_scheduler not in MEGATRON_SCHEDULERS:
        p.append(Problem("training.lr_scheduler", f"{t.lr_scheduler} has no Megatron equivalent; "
                         f"use one of {', '.join(MEGATRON_SCHEDULERS)}"))
    if t.epochs is not None and t.epochs != int(t.epochs):
        p.append(Problem("training.epochs", f"Megatron-SWIFT counts whole epochs ({t.epochs} given); "
                         "use a whole number or max_steps"))
    return p


def check_swift_passthrough(job: SwiftJob) -> list[Problem]:
    """Extra swift arguments may not override what mlaunch renders from the spec."""
    p: list[Problem] = []
    if job.cluster.env.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        p.append(Problem("cluster.env.ACCELERATE_USE_CPU", USE_CPU_WHY))
    for key, value in job.passthrough.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            p.append(Problem(f"passthrough.{key}", "not an ms-swift argument name (give it without "
                             "the leading --)"))
        elif key == "deepspeed":
            p.append(Problem("passthrough.deepspeed", DDP_NOT_DEEPSPEED))
        elif key == "train_type":
            p.append(Problem("passthrough.train_type", "ms-swift 4.x rejects --train_type (renamed "
                             "--tuner_type); set finetuning.type instead"))
        elif key == "use_cpu":
            p.append(Problem("passthrough.use_cpu", USE_CPU_WHY))
        elif key in SWIFT_OWNED:
            p.append(Problem(f"passthrough.{key}", f"mlaunch owns this argument; set "
                             f"{SWIFT_OWNED[key]} instead"))
        elif value is None or value == "" or value == []:
            p.append(Problem(f"passthrough.{key}", "empty value; give a value or remove the key"))
    return p

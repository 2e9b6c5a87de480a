"""Megatron-SWIFT's layout arithmetic, checked before launch as Megatron-Core checks it.

Megatron-Core (parallel_state.initialize_model_parallel) needs tp x pp x cp to divide the
world (dp = world / (tp x pp x cp)) and, for the expert layers, etp x ep x pp to divide it
too; the experts' own data-parallel size is then world / (etp x ep x pp). The number of
micro-batches per step is global_batch_size / (micro_batch_size x dp): context parallel
shares each sample across cp ranks, so it lowers dp, not the batch.
"""
from __future__ import annotations

from ..errors import Problem
from .models import SwiftJob
from .model_config import MEGATRON_SCHEDULERS, config_int, divisors, model_config
from .select import world_size, world_text

EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def data_parallel(job: SwiftJob) -> int:
    """Megatron's data-parallel size: world / (tp x pp x cp) (0 when it does not divide)."""
    m = job.megatron
    size, model = world_size(job), m.tp * m.pp * m.cp
    return size // model if size and size % model == 0 else 0


def check_megatron(job: SwiftJob) -> list[Problem]:
    """Layout, model shape, batch and the options Megatron-SWIFT cannot take."""
    p = _check_layout(job) + _check_model_shape(job) + _check_batch(job) + _check_recompute(job)
    f, t = job.finetuning, job.training
    if job.deepspeed:
        p.append(Problem("deepspeed", "Megatron-SWIFT does its own parallelism and optimizer "
                         "sharding; DeepSpeed cannot be combined with megatron: remove one"))
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


def _check_layout(job: SwiftJob) -> list[Problem]:
    """tp x pp x cp and etp x ep x pp both divide the world size."""
    m = job.megatron
    size = world_size(job)
    p: list[Problem] = []
    model = m.tp * m.pp * m.cp
    if size and size % model:
        cp = f" × cp {m.cp}" if m.cp != 1 else ""
        p.append(Problem("megatron", f"tp {m.tp} × pp {m.pp}{cp} = {model} does not divide the world "
                         f"size {size} ({world_text(job.cluster)}), so no whole number of "
                         f"data-parallel replicas fits; choose tp × pp{' × cp' if cp else ''} "
                         f"among {divisors(size)}"))
    expert = m.etp * m.ep * m.pp
    if (m.ep > 1 or m.etp > 1) and size and size % expert:
        p.append(Problem("megatron.ep", f"etp {m.etp} × ep {m.ep} × pp {m.pp} = {expert} does not "
                         f"divide the world size {size}, so Megatron cannot lay out the expert "
                         f"layers; choose etp × ep × pp among {divisors(size)}"))
    if m.ep > 1 and m.tp > 1 and not m.sequence_parallel:
        # Megatron-Core's ModelParallelConfig refuses this combination at start.
        p.append(Problem("megatron.sequence_parallel", f"ep {m.ep} with tp {m.tp} needs it: "
                         "Megatron-Core runs expert parallelism beside tensor parallelism only with "
                         "sequence parallelism; set sequence_parallel: true"))
    return p


def _check_model_shape(job: SwiftJob) -> list[Problem]:
    """pp divides the layers, tp the heads, ep the experts (when config.json is readable)."""
    m = job.megatron
    cfg = model_config(job.model)
    p: list[Problem] = []
    layers = config_int(cfg, "num_hidden_layers")
    if layers and layers % m.pp:
        p.append(Problem("megatron.pp", f"the model has {layers} layers ({job.model}/config.json), "
                         f"not divisible by pp {m.pp}; choose pp among {divisors(layers)}"))
    heads = config_int(cfg, "num_attention_heads")
    if heads and heads % m.tp:
        p.append(Problem("megatron.tp", f"the model has {heads} attention heads ({job.model}/config.json), "
                         f"not divisible by tp {m.tp}; choose tp among {divisors(heads)}"))
    experts = next((config_int(cfg, k) for k in EXPERT_KEYS if config_int(cfg, k)), None)
    if m.ep > 1 and cfg is not None and experts is None:
        p.append(Problem("megatron.ep", f"{m.ep} needs a mixture-of-experts model, but "
                         f"{job.model}/config.json names no experts; set ep to 1"))
    elif experts and experts % m.ep:
        p.append(Problem("megatron.ep", f"the model has {experts} experts ({job.model}/config.json), "
                         f"not divisible by ep {m.ep}; choose ep among {divisors(experts)}"))
    return p


def _check_batch(job: SwiftJob) -> list[Problem]:
    """global = dp x per_device x grad_accum with dp = world / (tp x pp x cp)."""
    b, m = job.batch, job.megatron
    if not isinstance(b.per_device, int) or not isinstance(b.grad_accum, int) or \
            job.training.gradient_checkpointing == "auto":
        return [Problem("batch.per_device", "mlaunch's batch planning does not cover Megatron-SWIFT: "
                        "give per_device (and grad_accum), and gradient_checkpointing true or false")]
    dp = data_parallel(job)
    if b.global_ is None or not dp:
        return []
    want = dp * b.per_device * b.grad_accum
    if b.global_ == want:
        return []
    cp = f" × cp {m.cp}" if m.cp != 1 else ""
    return [Problem("batch.global", f"{b.global_} ≠ dp {dp} × {b.per_device} per device × "
                    f"{b.grad_accum} accumulation = {want} (dp = {world_size(job)} GPUs / (tp {m.tp} × "
                    f"pp {m.pp}{cp})); set global to {want}, change per_device/grad_accum, or omit global")]


def _check_recompute(job: SwiftJob) -> list[Problem]:
    """megatron.recompute and an explicit training.gradient_checkpointing must agree."""
    r, t = job.megatron.recompute, job.training
    if r is None or "gradient_checkpointing" not in t.model_fields_set:
        return []
    if (r == "none") == (not t.gradient_checkpointing):
        return []
    return [Problem("megatron.recompute", f"{r} contradicts training.gradient_checkpointing: "
                    f"{str(t.gradient_checkpointing).lower()}; remove one of them")]

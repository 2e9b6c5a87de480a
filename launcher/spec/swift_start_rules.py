"""ms-swift 4.6's start-up refusals that depend on several arguments, checked by validate: the
same arithmetic swift's argument classes apply on every rank when the job starts
(SftArguments._check_padding_free; GRPO's generation batch in rlhf_trainers/args_mixin.py)."""
from __future__ import annotations

from ..errors import Problem
from .models import SwiftJob
from .select import world_size

FLASH = ("flash_attn", "flash_attention_2", "flash_attention_3", "flash_attention_4")
GRPO_GENERATIONS = 8   # ms-swift's default num_generations (RLHFArguments)


def check_swift_start(job: SwiftJob) -> list[Problem]:
    """Packing without flash attention; a GRPO num_generations the generation batch does not divide."""
    if job.megatron:
        return []
    return _packing(job) + _grpo(job)


def _on(value) -> bool:
    return value is True or str(value).lower() in ("true", "1", "yes")


def _packing(job: SwiftJob) -> list[Problem]:
    pt = job.passthrough
    feature = "packing" if _on(pt.get("packing")) else "padding_free" if _on(pt.get("padding_free")) else None
    if feature is None or pt.get("attn_impl") in FLASH:
        return []
    given = f"attn_impl {pt['attn_impl']!r}" if "attn_impl" in pt else "no attn_impl (sdpa or eager)"
    return [Problem(f"passthrough.{feature}", f"ms-swift's {feature} needs flash attention and the job has "
                    f"{given}; add `attn_impl: flash_attn` to passthrough (flash-attn installed on the "
                    f"nodes), or remove {feature}")]


def _grpo(job: SwiftJob) -> list[Problem]:
    """generation_batch_size (default per_device × world × grad_accum) % num_generations == 0."""
    if job.stage != "rlhf" or job.rlhf_type != "grpo":
        return []
    pt, per, accum = job.passthrough, job.batch.per_device, job.batch.grad_accum
    if not isinstance(per, int) or not isinstance(accum, int):
        return []   # mlaunch picks the batch later: submit's plan is checked by swift itself
    n = pt.get("num_generations", GRPO_GENERATIONS)
    if not isinstance(n, int) or isinstance(n, bool):
        return []
    where = "passthrough.num_generations" if "num_generations" in pt else "batch"
    if n <= 1:
        return [Problem(where, f"num_generations {n}: GRPO compares several answers per prompt; give 2 or more")]
    global_ = per * world_size(job)
    gen, steps = pt.get("generation_batch_size"), pt.get("steps_per_generation")
    if isinstance(gen, int) or not isinstance(steps, int):
        gen = gen if isinstance(gen, int) else global_ * accum
        how = "passthrough.generation_batch_size" if isinstance(pt.get("generation_batch_size"), int) else \
            f"per_device {per} × world {world_size(job)} × grad_accum {accum}"
    else:
        gen, how = global_ * steps, f"per_device {per} × world {world_size(job)} × steps_per_generation {steps}"
    if gen % n == 0:
        return []
    fits = [d for d in range(2, gen + 1) if gen % d == 0][:8]
    return [Problem(where, f"num_generations {n} does not divide the generation batch {gen} ({how}); ms-swift "
                    f"refuses it at start. Give num_generations one of {fits}" + (", ..." if len(fits) == 8 else "")
                    + ", or a batch it divides")]

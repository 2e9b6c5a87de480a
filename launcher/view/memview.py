"""How a batch decision reads: the table of memory terms, the choice and why; and as JSON."""
from __future__ import annotations

from ..plan.batch import Decision
from ..plan.memory import GIB

LABELS = {"weights": "weights", "gradients": "gradients", "optimizer": "optimizer states",
          "buffers": "communication buffers", "activations": "activations",
          "logits": "logits (loss in fp32)",
          "zero3": "ZeRO-3 gather/free growth", "step": "fp32 grads in optimizer step",
          "overhead": "CUDA context, allocator, NCCL"}


def lines(d: Decision) -> list[str]:
    """The human view: estimate table (when there is one), the numbers, who chose them, why."""
    out = []
    if d.estimate is not None:
        out.append("memory plan (per GPU):")
        width = max(len(v) for v in LABELS.values()) + 2
        out += [f"  {'term':<{width}}{'GiB':>8}"]
        out += [f"  {LABELS[k]:<{width}}{v / GIB:>8.2f}" for k, v in d.estimate.terms]
        out.append(f"  {'total':<{width}}{d.estimate.total / GIB:>8.2f}   of "
                   f"{d.budget / GIB:.1f} usable")
    who = "; ".join(([f"chosen by mlaunch: {', '.join(d.chosen)}"] if d.chosen else [])
                    + ([f"{', '.join(d.defaulted)}: the default"] if d.defaulted else [])) \
        or "all given in the spec"
    out.append(f"batch: per_device {d.per_device} × grad_accum {d.grad_accum}, gradient "
               f"checkpointing {'on' if d.checkpointing else 'off'} ({who})")
    out += [f"  {w}" for w in d.why]
    return out


def to_dict(d: Decision) -> dict:
    """The same as data, for `mlaunch plan --json`."""
    est = d.estimate
    return {
        "per_device": d.per_device, "grad_accum": d.grad_accum,
        "gradient_checkpointing": d.checkpointing, "chosen": list(d.chosen),
        "gpu_gib": d.inputs.gpu_gib, "gpu_source": d.inputs.gpu_source,
        "config_source": d.inputs.config_source,
        "estimate_gib": est.gib() if est else None,
        "usable_gib": round(d.budget / GIB, 2) if d.budget else None,
        "why": list(d.why), "problems": [str(p) for p in d.problems],
        "candidates": [{"per_device": c.micro_batch, "gradient_checkpointing": c.checkpointing,
                        "total_gib": round(c.total / GIB, 2), "fits": c.fits} for c in d.candidates],
    }

"""Each trainer's own defaults for the spec fields a job leaves out.

The spec models are shared by LLaMA-Factory and ms-swift, and their field defaults are
LLaMA-Factory's (what llamafactory.yaml.j2 has always rendered). A `trainer: swift` job that
leaves a field out must train as `swift sft` / `megatron sft` would, so the swift renderer
asks here: the user's value when the field was given (pydantic's model_fields_set), else
ms-swift 4.6's default. The dry-run prints the defaults in use (`defaults_in_use`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Default:
    """One trainer default: the spec field, the value, and the trainer argument it stands for."""

    field: str
    value: Any          # None: the argument is not rendered and the trainer decides
    argument: str
    shown: str          # how the dry-run and the README name the value


# ms-swift 4.6.0's own defaults (parsed from its dataclasses: SftArguments / RLHFArguments /
# PretrainArguments and MegatronSftArguments), where mlaunch's shared defaults differ.
SWIFT = (
    Default("finetuning.lora_alpha", 32, "lora_alpha", "32"),
    Default("finetuning.lora_dropout", 0.05, "lora_dropout", "0.05"),
    Default("training.logging_steps", 5, "logging_steps", "5"),
    Default("max_length", None, "max_length", "the model's maximum (not rendered)"),
)
MEGATRON = SWIFT + (
    Default("megatron.recompute", "selective", "recompute_granularity", "selective"),
)

# LLaMA-Factory: the shared models' own defaults, listed for the README's table.
LLAMAFACTORY = (
    Default("finetuning.lora_alpha", None, "lora_alpha", "2 × lora_rank"),
    Default("finetuning.lora_dropout", 0.0, "lora_dropout", "0.0"),
    Default("training.logging_steps", 10, "logging_steps", "10"),
    Default("cutoff_len", 2048, "cutoff_len", "2048"),
)


def _given(job: Any, path: str) -> tuple[bool, Any]:
    """(was the field set in the spec, its value) for a dotted path like training.logging_steps."""
    obj = job
    *parents, name = path.split(".")
    for part in parents:
        obj = getattr(obj, part, None)
        if obj is None:
            return False, None
    return name in obj.model_fields_set, getattr(obj, name, None)


def table(job: Any) -> tuple[Default, ...]:
    """The defaults that apply to this swift job (Megatron-SWIFT adds recompute)."""
    defaults = MEGATRON if getattr(job, "megatron", None) else SWIFT
    lora = job.finetuning.type == "lora"
    return tuple(d for d in defaults if lora or not d.field.startswith("finetuning.lora"))


def value(job: Any, path: str) -> Any:
    """The value a swift job trains with: the spec's when given, else ms-swift's default."""
    given, val = _given(job, path)
    if given:
        return val
    for d in table(job):
        if d.field == path:
            return d.value
    return val


def defaults_in_use(job: Any) -> list[str]:
    """One line per field left out whose value is ms-swift's, for the dry-run."""
    return [f"{d.field}: {d.shown} (ms-swift's default --{d.argument})"
            for d in table(job) if not _given(job, d.field)[0]
            and not (d.field == "megatron.recompute" and _recompute_from_gc(job))]


def _recompute_from_gc(job: Any) -> bool:
    """training.gradient_checkpointing given: Megatron recompute follows it (full / none)."""
    return "gradient_checkpointing" in job.training.model_fields_set


def recompute(job: Any) -> str:
    """Megatron --recompute_granularity: megatron.recompute, else gradient_checkpointing when
    given (true: full, false: none), else Megatron-SWIFT's selective."""
    m = job.megatron
    if m.recompute is not None:
        return m.recompute
    if _recompute_from_gc(job):
        return "full" if job.training.gradient_checkpointing else "none"
    return "selective"

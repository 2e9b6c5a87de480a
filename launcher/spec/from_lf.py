"""A LLaMA-Factory training YAML read as an mlaunch job spec: recognised, each key's place
in the spec named, and the spec written (`mlaunch init --from-llamafactory`).

The key -> field table is rules.LLAMAFACTORY_OWNED (what llamafactory.yaml.j2 renders each
field as), read backwards; only the keys whose value changes form on the way (bf16, do_train,
disable_gradient_checkpointing, deepspeed's file, fsdp's string) are spelled out here. Keys
the spec has no field for go to passthrough, which the template renders as they are.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any

from ..errors import Problem, SpecError
from .rules import LLAMAFACTORY_OWNED

# What LLaMA-Factory (the HF Trainer) does with a key left out, where mlaunch's own default
# differs: init writes these so that the job trains as the YAML did.
TRAINER_DEFAULTS = {
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "learning_rate": 5e-5,
    "num_train_epochs": 3.0, "lr_scheduler_type": "linear", "logging_steps": 500,
    "finetuning_type": "lora",
}
# Keys whose value mlaunch sets itself (or a submit flag does): dropped, with the reason.
DROPPED = {
    "do_train": "implied by stage (mlaunch always trains)",
    "overwrite_output_dir": "mlaunch guards output_dir: `mlaunch submit --overwrite` starts fresh",
    "resume_from_checkpoint": "`mlaunch submit --resume` (or --resume=PATH) continues a run",
    "run_name": "mlaunch names each run by its run id",
    "fsdp_config": "read with fsdp (its layer classes, backward_prefetch, cpu_ram_efficient_loading)",
}


class LlamaFactoryYaml(SpecError):
    """validate given a LLaMA-Factory YAML: every key's place is shown, however many."""

    def lines(self, limit: int | None = None) -> list[str]:
        return super().lines(None)


def looks_like_llamafactory(raw: Any) -> bool:
    """A mapping with no `trainer:` that names a model the LLaMA-Factory way and a stage or a
    fine-tuning type: someone's llamafactory-cli YAML given to mlaunch as is."""
    return (isinstance(raw, dict) and "trainer" not in raw and "model_name_or_path" in raw
            and ("stage" in raw or "finetuning_type" in raw))


def one_to_one(key: str) -> str | None:
    """The spec field a LLaMA-Factory key sets unchanged (`learning_rate` -> training.learning_rate),
    else None (a key whose value changes form, a flag's, or no field's)."""
    if key in DROPPED or key in _FORMED:
        return None
    field = LLAMAFACTORY_OWNED.get(key)
    return field if field and re.fullmatch(r"[a-z_]+(\.[a-z_]+)?", field) else None


def places(raw: dict) -> list[Problem]:
    """One line per key of a LLaMA-Factory YAML: where it goes in an mlaunch spec
    (`per_device_train_batch_size: 1 → batch.per_device: 1`)."""
    out = []
    for key, value in raw.items():
        key, given = str(key), f"{key}: {_short(value)}"
        if key in DROPPED:
            out.append(Problem("", f"{given} → not in the spec: {DROPPED[key]}"))
        elif key in _FORMED:
            out.append(Problem("", f"{given} → {_FORMED[key][1](value)}"))
        elif one_to_one(key):
            out.append(Problem("", f"{given} → {one_to_one(key)}: {_short(value)}"))
        else:
            out.append(Problem("", f"{given} → passthrough.{key} (given to LLaMA-Factory as is)"))
    return out


def to_spec(raw: dict, hosts: list[str], gpus_per_node: int, name: str, base: str = ".",
            workdir: str | None = None) -> tuple[dict, list[str]]:
    """The mlaunch spec (a dict in the spec's field order) for a LLaMA-Factory YAML, and notes
    on what changed form or was dropped. base: the YAML's directory (a deepspeed file there);
    workdir: where a relative output_dir resolves, as llamafactory-cli's working directory did."""
    given = {str(k): v for k, v in raw.items()}
    notes = [f"{k}: dropped; {DROPPED[k]}" for k in given if k in DROPPED]
    for key, value in TRAINER_DEFAULTS.items():
        if key not in given and not (key == "num_train_epochs" and "max_steps" in given):
            given[key] = value
            notes.append(f"{key}: not in the YAML; LLaMA-Factory's default {value} written")
    spec: dict[str, Any] = {"name": name, "trainer": "llamafactory",
                            "cluster": {"hosts": list(hosts), "gpus_per_node": gpus_per_node}}
    for key, value in given.items():
        if key in DROPPED:
            continue
        if key in _FORMED:
            notes += _FORMED[key][0](spec, value, given, base) or []
        elif one_to_one(key):
            _put(spec, one_to_one(key), value)
        else:
            spec.setdefault("passthrough", {})[key] = value
    spec.setdefault("precision", "fp32")   # neither bf16 nor fp16: the Trainer's fp32
    out_dir = str(spec.get("output_dir", ""))
    if workdir and out_dir and not out_dir.startswith(("/", "~")):
        spec["cluster"]["workdir"] = workdir
        notes.append(f"cluster.workdir: {workdir}, where llamafactory-cli resolved the relative "
                     f"output_dir {out_dir}; every node must see it (shared storage), or change it")
    return _ordered(spec), notes


def _put(spec: dict, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = spec
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def _precision(spec: dict, value: Any, given: dict, base: str) -> None:
    if given.get("bf16") is True:
        spec["precision"] = "bf16"
    elif given.get("fp16") is True:
        spec["precision"] = "fp16"


def _dataset(spec: dict, value: Any, given: dict, base: str) -> None:
    names = [n.strip() for n in value.split(",")] if isinstance(value, str) else value
    spec["dataset"] = names[0] if isinstance(names, list) and len(names) == 1 else names


def _gradient_checkpointing(spec: dict, value: Any, given: dict, base: str) -> None:
    _put(spec, "training.gradient_checkpointing", not value)


def _deepspeed(spec: dict, value: Any, given: dict, base: str) -> list[str]:
    """LLaMA-Factory's `deepspeed: FILE`: stage and offload when the file only chooses those (its
    numbers "auto", as LLaMA-Factory's own examples), else the file itself; a file not found:
    the stage its name says (ds_z3_offload_config.json), with a note."""
    path = os.path.join(base, os.path.expanduser(str(value)))
    if os.path.isfile(path):
        try:
            config = json.load(open(path, encoding="utf-8"))
        except (OSError, ValueError):
            config = None
        simple = _stage_of(config) if isinstance(config, dict) else None
        spec["deepspeed"] = simple or {"config": os.path.abspath(path)}
        return [] if simple else [f"deepspeed: your {value} is read as is (deepspeed.config)"]
    m = re.search(r"z(?:ero)?_?([0-3])", os.path.basename(str(value)))
    if not m:
        spec["deepspeed"] = {"config": str(value)}
        return [f"deepspeed: {value} not found from {base}; give its path in deepspeed.config"]
    stage = int(m[1])
    spec["deepspeed"] = {"stage": stage}
    if "offload" in str(value):
        spec["deepspeed"]["offload_optimizer"] = "cpu"
        if stage == 3:
            spec["deepspeed"]["offload_param"] = "cpu"
    return [f"deepspeed: {value} not found from {base}; ZeRO-{stage} taken from its name "
            "(point deepspeed.config at the file to use its settings)"]


_ZERO_CHOICES = {"stage", "offload_optimizer", "offload_param"}


def _stage_of(config: dict) -> dict | None:
    """{stage, offload_*} when the config chooses nothing else (every other value "auto" or
    DeepSpeed's own default kept by mlaunch), else None."""
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict) or not isinstance(zero.get("stage"), int):
        return None
    if any(k not in _ZERO_CHOICES and k not in _ZERO_USUAL for k in zero):
        return None
    out: dict[str, Any] = {"stage": zero["stage"]}
    for key in ("offload_optimizer", "offload_param"):
        device = (zero.get(key) or {}).get("device", "none") if isinstance(zero.get(key), dict) else "none"
        if device != "none":
            out[key] = device
    return out


# Tuning keys LLaMA-Factory's example configs set to values mlaunch also renders.
_ZERO_USUAL = {"allgather_partitions", "allgather_bucket_size", "overlap_comm", "reduce_scatter",
               "reduce_bucket_size", "contiguous_gradients", "round_robin_gradients", "sub_group_size",
               "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
               "stage3_max_live_parameters", "stage3_max_reuse_distance",
               "stage3_gather_16bit_weights_on_model_save"}


def _fsdp(spec: dict, value: Any, given: dict, base: str) -> list[str]:
    """`fsdp: "full_shard auto_wrap offload"` -> fsdp: {sharding, auto_wrap, offload}."""
    words = str(value).split() if value else []
    if not words:
        return []
    sharding = next((w for w in words if w not in ("auto_wrap", "offload")), "full_shard")
    block: dict[str, Any] = {"sharding": sharding, "auto_wrap": "auto_wrap" in words,
                             "offload": "offload" in words}
    cfg = given.get("fsdp_config")
    layers = cfg.get("transformer_layer_cls_to_wrap") if isinstance(cfg, dict) else None
    if layers:
        block["layer_cls"] = [layers] if isinstance(layers, str) else list(layers)
    for key in ("backward_prefetch", "cpu_ram_efficient_loading"):
        value = cfg.get(key, cfg.get(f"fsdp_{key}")) if isinstance(cfg, dict) else None
        if value is not None:
            block[key] = value.lower() if isinstance(value, str) else value
    spec["fsdp"] = block
    return []


# key -> (how its value enters the spec, the place validate names for a value)
_FORMED = {
    "bf16": (_precision, lambda v: "precision: bf16" if v is True else "precision: fp32 (or fp16 with fp16: true)"),
    "fp16": (_precision, lambda v: "precision: fp16" if v is True else "precision: fp32 (or bf16 with bf16: true)"),
    "dataset": (_dataset, lambda v: "dataset: " + _short([n.strip() for n in v.split(",")]
                                                           if isinstance(v, str) else v)),
    "disable_gradient_checkpointing": (_gradient_checkpointing,
                                       lambda v: f"training.gradient_checkpointing: {_short(not v)}"),
    "deepspeed": (_deepspeed, lambda v: "deepspeed: {stage: N, offload_optimizer: cpu, ...} as the file "
                                        "says, or {config: FILE} for one with its own tuning"),
    "fsdp": (_fsdp, lambda v: "fsdp: {sharding: ..., auto_wrap: ..., offload: ...} from the words"),
}

# The spec's field order, for a spec that reads like the README's.
_ORDER = ("name", "trainer", "cluster", "stage", "model", "template", "dataset", "dataset_dir",
          "cutoff_len", "finetuning", "batch", "precision", "deepspeed", "fsdp", "preference",
          "training", "report_to", "output_dir", "passthrough")


def _ordered(spec: dict) -> dict:
    return {k: spec[k] for k in sorted(spec, key=lambda k: _ORDER.index(k) if k in _ORDER else len(_ORDER))}


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."

"""An ms-swift command line (`swift sft --model ... --dataset ...`) read as an mlaunch job spec,
for `mlaunch init --from-swift`: swift_rules.SWIFT_OWNED (what swift_args.j2 renders each field
as) read backwards; only the arguments whose value changes form are spelled out here; the
others go to passthrough as they are."""
from __future__ import annotations

import os
import re
import shlex
from typing import Any

from ..errors import UserError
from .swift_rules import SWIFT_OWNED

ENTRIES = {("swift", "sft"): ("sft", False), ("swift", "pt"): ("pt", False), ("swift", "rlhf"): ("rlhf", False),
           ("megatron", "sft"): ("sft", True), ("megatron", "pt"): ("pt", True), ("megatron", "rlhf"): ("rlhf", True)}
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
# Arguments whose value changes form (or that mlaunch sets itself): handled below, never 1:1.
_FORMED = ("tuner_type", "train_type", "target_modules", "torch_dtype", "bf16", "fp16", "deepspeed",
           "quant_bits", "quant_method", "dataset", "freeze_parameters_ratio", "trainable_parameters_regex",
           "check_model", "resume_from_checkpoint", "mcore_model", "mcore_adapter", "finetune",
           "recompute_granularity", "recompute_method", "recompute_num_layers", "gradient_checkpointing",
           "rlhf_type")


def parse_command(text: str) -> tuple[str, bool, dict[str, Any]]:
    """(stage, megatron, {argument: value}) of `swift sft --a 1 --b x y`; values typed as YAML
    would (1e-4 a number, true a boolean), several words a list."""
    words = shlex.split(text.replace("\\\n", " "))
    words = [w for w in words if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", w)]   # NPROC_PER_NODE=8 ...
    if len(words) < 2 or (words[0], words[1]) not in ENTRIES:
        raise UserError("--from-swift: not an ms-swift command line; give it as one argument, e.g. "
                        "--from-swift 'swift sft --model Qwen/Qwen2.5-7B-Instruct --dataset ...'")
    stage, megatron = ENTRIES[(words[0], words[1])]
    if megatron:   # global_batch_size -> grad_accum over dp, recompute, finetune: not done yet
        raise UserError("--from-swift: Megatron-SWIFT command lines are not converted (yet); start from "
                        "configs/swift-examples/megatron-*.yaml, whose megatron: section they fill")
    args: dict[str, list[str]] = {}
    key = None
    for w in words[2:]:
        if w.startswith("--"):
            key, _, inline = w[2:].partition("=")
            args[key] = [inline] if inline else []
        elif key is not None:
            args[key].append(w)
        else:
            raise UserError(f"--from-swift: {w!r} before any --argument; write --key value")
    return stage, megatron, {k: _typed(v) for k, v in args.items()}


def _typed(values: list[str]) -> Any:
    one = [_word(v) for v in values]
    return True if not one else one[0] if len(one) == 1 else one


def _word(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if _NUMBER.match(text):
        number = float(text)
        return int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number
    return text


def to_spec(stage: str, megatron: bool, args: dict, hosts: list[str], gpus_per_node: int,
            name: str) -> tuple[dict, list[str]]:
    """The spec (a dict) for ms-swift's arguments, and notes on what changed form or was left."""
    notes: list[str] = []
    spec: dict[str, Any] = {"name": name, "trainer": "swift",
                            "cluster": {"hosts": list(hosts), "gpus_per_node": gpus_per_node}, "stage": stage}
    ft = {"type": str(args.get("tuner_type", args.get("train_type", "lora")))}
    if ft["type"] not in ("lora", "full"):
        notes.append(f"tuner_type {ft['type']}: mlaunch renders lora or full; written as given (validate says)")
    spec["finetuning"] = ft
    for key, value in args.items():
        if key in _FORMED:
            continue
        field = SWIFT_OWNED.get(key)
        if field and re.fullmatch(r"[a-z_]+(\.[a-z_]+)?", field) and field != "precision":
            _put(spec, field, value)
        elif field:
            notes.append(f"--{key}: not converted (mlaunch sets {field} itself)")
        else:
            spec.setdefault("passthrough", {})[key] = value
    data = args.get("dataset")
    spec["dataset"] = data if isinstance(data, list) else [data] if data is not None else []
    if "target_modules" in args:
        targets = args["target_modules"] if isinstance(args["target_modules"], list) else [args["target_modules"]]
        targets = ["all" if t == "all-linear" else t for t in targets]
        ft["lora_target"] = targets[0] if len(targets) == 1 else targets
    if "quant_bits" in args:
        ft["quantization_bit"] = args["quant_bits"]
    dtype = args.get("torch_dtype")
    spec["precision"] = DTYPES.get(str(dtype), "bf16")
    if dtype is None:
        notes.append("precision: bf16 (no --torch_dtype: ms-swift takes the model's own dtype)")
    if "rlhf_type" in args:
        spec["rlhf_type"] = args["rlhf_type"]
    if "deepspeed" in args:
        spec["deepspeed"] = _deepspeed(args["deepspeed"])
    if "gradient_checkpointing" in args:
        _put(spec, "training.gradient_checkpointing", args["gradient_checkpointing"])
    training = spec.setdefault("training", {})
    if "learning_rate" not in training:
        training["learning_rate"] = 1e-4 if ft["type"] == "lora" else 1e-5
        notes.append(f"training.learning_rate: {training['learning_rate']:g}, ms-swift's default for {ft['type']}")
    if "epochs" not in training and "max_steps" not in training:
        training["epochs"] = 3
        notes.append("training.epochs: 3, ms-swift's default")
    batch = spec.setdefault("batch", {})
    batch.setdefault("per_device", 1)
    if "grad_accum" not in batch:
        notes.append("batch.grad_accum: 1 (ms-swift's own default depends on the world size: set it)")
    if "output_dir" not in spec:
        spec["output_dir"] = f"output/{os.path.basename(str(spec.get('model', 'model')).rstrip('/'))}"
        notes.append(f"output_dir: {spec['output_dir']}, ms-swift's default")
    if megatron:
        spec.setdefault("megatron", {})
    order = ("name", "trainer", "cluster", "stage", "rlhf_type", "model", "model_type", "template", "dataset",
             "max_length", "finetuning", "batch", "precision", "deepspeed", "megatron", "training", "output_dir",
             "passthrough")
    return {k: spec[k] for k in sorted(spec, key=lambda k: order.index(k) if k in order else len(order))}, notes


def _deepspeed(value: Any) -> Any:
    """ms-swift's `--deepspeed zero3_offload`: the stage and offload it names; a file stays a file."""
    m = re.fullmatch(r"zero([0-3])(_offload)?", str(value))
    if not m:
        return {"config": value} if str(value).endswith(".json") else value
    out: dict[str, Any] = {"stage": int(m[1])}
    if m[2]:
        out["offload_optimizer"] = "cpu"
        if m[1] == "3":
            out["offload_param"] = "cpu"
    return out


def _put(spec: dict, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = spec
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value

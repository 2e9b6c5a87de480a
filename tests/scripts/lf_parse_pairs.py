"""Parse pairs of LLaMA-Factory arguments with LLaMA-Factory's own get_train_args, under torchrun.

argv: PAIRS.json OUT.json. PAIRS is a list of {"name", "cwd", "example": dict, "mlaunch": yaml path}.
Every rank parses every pair (the Trainer's arguments set up the process group and DeepSpeed);
rank 0 writes {name: {"example": {...}, "mlaunch": {...}}} with each side's effective arguments
as "group.key" -> JSON value, or {"error": text} when the parser refused that side.
"""
import dataclasses
import gc
import json
import os
import sys

import transformers.training_args as hf_args
import yaml
from llamafactory.hparams import get_train_args

# The examples ask for bf16, which the Trainer's arguments refuse on a machine without a GPU.
# This compares arguments, not hardware: answer the GPU question as a bf16 GPU would.
hf_args.is_torch_bf16_gpu_available = lambda: True

GROUPS = ("model", "data", "training", "finetuning", "generating")


def effective(args: dict) -> dict:
    try:
        parsed = get_train_args(args)
    except (ValueError, SystemExit, AssertionError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    out = {}
    for group, obj in zip(GROUPS, parsed):
        values = obj.to_dict() if hasattr(obj, "to_dict") else dataclasses.asdict(obj)
        for key, value in values.items():
            out[f"{group}.{key}"] = json.loads(json.dumps(value, default=str))
    del parsed
    gc.collect()   # the Trainer's DeepSpeed config is a weakly referenced global
    os.environ.pop("ACCELERATE_USE_DEEPSPEED", None)
    return out


def main() -> None:
    pairs = json.load(open(sys.argv[1]))
    results = {}
    for pair in pairs:
        os.chdir(pair["cwd"])   # the examples name their DeepSpeed config relative to it
        results[pair["name"]] = {"example": effective(dict(pair["example"])),
                                 "mlaunch": effective(yaml.safe_load(open(pair["mlaunch"])))}
    if int(os.environ.get("RANK", "0")) == 0:
        with open(sys.argv[2], "w") as fh:
            json.dump(results, fh)


main()

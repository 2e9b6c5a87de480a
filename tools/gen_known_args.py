"""Regenerate launcher/spec/known_args.json: the argument names each trainer accepts, and the
names of its chat templates (the spec's `template`).

    MLAUNCH_SWIFT_VENV/bin/python   tools/gen_known_args.py swift
    MLAUNCH_TRAINER_VENV/bin/python tools/gen_known_args.py llamafactory

Each run replaces its trainer's section (names read from the installed trainer's own
dataclasses through its HfArgumentParser) and records the versions it read them from.
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(os.path.dirname(HERE), "launcher", "spec", "known_args.json")
SWIFT_ENTRIES = ("swift.sft", "swift.pt", "swift.rlhf", "megatron.sft", "megatron.pt", "megatron.rlhf")


def swift_section() -> dict:
    sys.path.insert(0, HERE)
    import swift
    import swift_args
    from swift.template import TEMPLATE_MAPPING
    return {"version": swift.__version__,
            "entries": {e: swift_args.names(e) for e in SWIFT_ENTRIES},
            "templates": sorted(TEMPLATE_MAPPING)}


def llamafactory_section() -> dict:
    import llamafactory
    import transformers
    from llamafactory.data.template import TEMPLATES
    from llamafactory.hparams.parser import _TRAIN_ARGS
    from transformers import HfArgumentParser
    names = set()
    for action in HfArgumentParser(_TRAIN_ARGS)._actions:
        names.update(o[2:] for o in action.option_strings if o.startswith("--") and "-" not in o[2:])
    names.discard("help")
    return {"version": llamafactory.__version__, "transformers": transformers.__version__,
            "entries": {"llamafactory": sorted(names)}, "templates": sorted(TEMPLATES)}


def main(trainer: str) -> int:
    data = {}
    if os.path.exists(DATA):
        with open(DATA, encoding="utf-8") as fh:
            data = json.load(fh)
    data[trainer] = swift_section() if trainer == "swift" else llamafactory_section()
    with open(DATA, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=0, sort_keys=True)
        fh.write("\n")
    print(f"{DATA}: {trainer} {data[trainer]['version']}: "
          + ", ".join(f"{k} {len(v)}" for k, v in data[trainer]["entries"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

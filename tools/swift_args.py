"""ms-swift 4.6's own argument parsers, usable on a CPU machine without Megatron-Core.

Run with the swift venv's python. `parse` reads JSON {"jobs": [[entry, [argv...]], ...]}
on stdin and prints, per job, every argument's effective value as ms-swift's
HfArgumentParser reads it (defaults filled in, types converted; __post_init__ is not run,
it needs the model and a GPU), or the parser's error. `names ENTRY...` prints the argument
names of each entry (swift.sft, swift.pt, swift.rlhf, megatron.sft, megatron.pt,
megatron.rlhf) as a JSON list; tools/gen_known_args.py collects them.

Megatron-SWIFT's argument modules import megatron.core, mcore_bridge and transformer_engine
at the top; only names and __post_init__ code use them, so a stand-in module that answers
any attribute lets the dataclasses (and so the parser) be built. Never used to train.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import io
import json
import sys
import types

STUBBED = ("megatron", "mcore_bridge", "transformer_engine", "apex")


class _Anything:
    """Stands for any name from a stubbed module (a class base, a decorator, a constant)."""

    def __init__(self, *a, **k):
        pass

    def __getattr__(self, name):
        return _Anything()

    def __call__(self, *a, **k):
        return _Anything()

    def __mro_entries__(self, bases):
        return (object,)

    def __getitem__(self, key):
        return _Anything()

    def __iter__(self):
        return iter(())


class _StubModule(types.ModuleType):
    __version__ = "0.16.0"

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


def dataclass_for(entry: str):
    """The arguments dataclass that `swift <stage>` / `megatron <stage>` parses into."""
    kind, stage = entry.split(".")
    if kind == "megatron":
        sys.meta_path.insert(0, _StubFinder())
        from swift.megatron import arguments as m
        return {"sft": m.MegatronSftArguments, "pt": m.MegatronPretrainArguments,
                "rlhf": m.MegatronRLHFArguments}[stage]
    from swift import arguments as a
    return {"sft": a.SftArguments, "pt": a.PretrainArguments, "rlhf": a.RLHFArguments}[stage]


def parser_for(entry: str):
    from transformers import HfArgumentParser
    return HfArgumentParser(dataclass_for(entry))


def names(entry: str) -> list[str]:
    """Every option the parser accepts, without the leading --, underscore spelling only."""
    out = set()
    for action in parser_for(entry)._actions:
        for opt in action.option_strings:
            if opt.startswith("--") and "-" not in opt[2:]:
                out.add(opt[2:])
    out.discard("help")
    return sorted(out)


def _plain(value):
    """JSON-safe form of a parsed value (enums, tuples)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def parse(entry: str, argv: list[str]) -> dict:
    """{"args": {name: value}} as ms-swift's parser reads argv, or {"error": text}."""
    parser = parser_for(entry)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns, rest = parser.parse_known_args(argv)
    except SystemExit:
        return {"error": err.getvalue().strip().splitlines()[-1]}
    if rest:
        return {"error": f"unrecognized arguments: {' '.join(rest)}"}
    return {"args": {k: _plain(v) for k, v in vars(ns).items()}}


def main(argv: list[str]) -> int:
    if argv[:1] == ["names"]:   # names ENTRY...: {entry: names}, one import for them all
        print(json.dumps({entry: names(entry) for entry in argv[1:]}))
        return 0
    jobs = json.load(sys.stdin)["jobs"]
    print(json.dumps([parse(entry, args) for entry, args in jobs]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""mlaunch's words for pydantic's generic errors (bounds, types, missing fields), so no line
reads "Input should be ...": each says the value given, what is wrong with it and what to
write instead. launcher/spec/explain.py calls `generic` for every error it has no special
case for; the accepted forms come from the field's own type (explain._forms)."""
from __future__ import annotations

from typing import Any

# pydantic error type -> what is wrong with the value, in a few words.
WRONG = {
    "less_than_equal": "is too large", "less_than": "is too large",
    "greater_than_equal": "is too small", "greater_than": "is too small",
    "int_parsing": "is not an integer", "int_type": "is not an integer",
    "int_from_float": "is not a whole number", "float_parsing": "is not a number",
    "float_type": "is not a number", "bool_parsing": "is not true or false",
    "bool_type": "is not true or false", "string_type": "is not text",
    "list_type": "is not a list", "too_short": "is too short", "too_long": "is too long",
    "enum": "is not one of the choices", "finite_number": "is not a finite number",
}
# pydantic's own constraint names (its error ctx) in symbols, for fields whose type is unknown.
_CTX = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))

# The smallest text that fills a required field, for "required field missing".
MINIMAL = {
    "name": "`name: my-job` (letters, digits, . _ -; it becomes part of the run id)",
    "cluster": "`cluster: {hosts: [node0], gpus_per_node: 8}`",
    "output_dir": "`output_dir: /mnt/shared/output/my-job` (absolute, on storage every node sees)",
    "model": "`model: /path/to/model`, or a hub id such as `model: Qwen/Qwen2.5-7B-Instruct`",
    "dataset": "`dataset: alpaca_en_demo` (one name or a list of them)",
    "finetuning": "`finetuning: {type: lora}` (lora, oft, freeze or full)",
    "finetuning.type": "`type: lora` under finetuning (lora, oft, freeze or full)",
    "batch": "`batch: {per_device: 1, grad_accum: 8}`, or `batch: {global: 64}` to let "
             "mlaunch choose the rest",
    "training": "`training: {learning_rate: 1.0e-4, epochs: 3}`",
    "training.learning_rate": "`learning_rate: 1.0e-4` under training",
    "script": "`script: {path: /abs/train.py}` (or `module: pkg.train`)",
}


def shown_value(given: Any, masked: str) -> str:
    """The value as the user wrote it in YAML: null for None, else the repr (or ***)."""
    return "null (empty)" if given is None else masked


def generic(kind: str, given: Any, shown: str, path: str, forms: list[str], description: str | None,
            ctx: dict | None) -> str:
    """`70000 is too large: write an integer from 1024 to 65535` for a pydantic error."""
    if kind == "missing":
        return missing(path, forms, description)
    if given is None and path in MINIMAL:
        return f"empty; write {MINIMAL[path]}"
    if kind == "mlaunch_limit":   # spec.models._at_most: an upper bound past any real job
        limit = (ctx or {}).get("limit")
        rest = "".join(f", or {f}" for f in forms if not f.startswith("an integer"))
        return (f"{shown} is too large: write an integer from 1 to {limit}{rest} (the limit is "
                "past any real job; a larger value is a typo)")
    wrong = WRONG.get(kind, "is not accepted")
    if kind == "list_type" and isinstance(given, (str, int, float)) and not isinstance(given, bool):
        leaf = path.rpartition(".")[2]
        words = _split_words(given)
        if len(words) > 1:   # `args: '--epochs 3 --lr 3e-4'`: one list item per word, as a shell splits it
            return (f"{shown} is one value, not a list: write `{leaf}: [{', '.join(words)}]` "
                    f"({len(words)} arguments, as a shell splits them)")
        return f"{shown} is one value, not a list: write `{leaf}: [{given}]`" + _about(description)
    if not forms:
        forms = [" and ".join(f"a value {sym} {ctx[k]}" for k, sym in _CTX if k in (ctx or {}))
                 or "the value this field takes"]
    return f"{shown} {wrong}: write " + ", or ".join(forms) + _about(description)


def blank(shown: str, path: str, optional: bool) -> str:
    """`model: '' is empty; write ...`: an empty or all-blank path, worded as `model: null` is
    (a path field: spec.cluster_spec.PathText); an optional one may be left out instead."""
    if path in MINIMAL:
        return f"{shown} is empty; write {MINIMAL[path]}"
    leaf = path.rpartition(".")[2]
    return f"{shown} is empty; write `{leaf}: PATH`" + (f", or leave {leaf} out" if optional else "")


def missing(path: str, forms: list[str], description: str | None) -> str:
    """`required field missing; add batch: {...}`: the smallest text that fills the field."""
    if path in MINIMAL:
        return f"required field missing; add {MINIMAL[path]}"
    leaf = path.rpartition(".")[2]
    what = f" ({', or '.join(forms)})" if forms else ""
    return f"required field missing; add `{leaf}: …`{what}" + _about(description)


def _about(description: str | None) -> str:
    return f"; {description}" if description else ""


def _split_words(given) -> list[str]:
    """The words of a command-line string as a shell splits them ([] if it cannot)."""
    import shlex
    try:
        return shlex.split(given) if isinstance(given, str) else []
    except ValueError:
        return []

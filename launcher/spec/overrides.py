"""Command-line overrides of a spec: `KEY.PATH=VALUE` (dotted keys, YAML values), as
llamafactory-cli and OmegaConf's dot-lists take them; applied to the parsed YAML before
validation, so every rule sees the overridden spec."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from ..errors import Problem, SpecError
from .explain import SECRET_NAME
from .inputs import AliasBomb, BoundedLoader

_KEY = re.compile(r"^[A-Za-z_][\w-]*(\.[\w-]+)*$")
# PyYAML (YAML 1.1) reads 1e-5 as a string; a user writing it on a command line means a number.
_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


@dataclass(frozen=True)
class Override:
    """One KEY=VALUE from the command line: the dotted key, the parsed value, the text."""

    key: str
    value: Any
    text: str


def is_override(arg: str) -> bool:
    """An argument of the form KEY=VALUE (a key before the first '=')."""
    return "=" in arg and bool(_KEY.match(arg.split("=", 1)[0]))


def parse(args: tuple[str, ...] | list[str]) -> tuple[Override, ...]:
    """The overrides, or a SpecError naming each argument that is not KEY=VALUE or not YAML."""
    out, bad = [], []
    for arg in args:
        key, sep, text = arg.partition("=")
        if not sep or not _KEY.match(key):
            bad.append(Problem(f"override {arg!r}", "not KEY=VALUE; write a dotted key, e.g. "
                               "training.learning_rate=1e-5"))
            continue
        try:
            value = yaml.load(text, Loader=BoundedLoader) if text.strip() else ""
        except AliasBomb as e:
            bad.append(Problem(f"override {key}", str(e)))
            continue
        except yaml.YAMLError as e:
            bad.append(Problem(f"override {arg}", f"the value is not YAML ({' '.join(str(e).split()[:8])}); "
                               "quote it, e.g. key='[a, b]'"))
            continue
        if isinstance(value, str) and _NUMBER.match(text.strip()):   # unquoted: "3" stays text
            value = float(value)
        out.append(Override(key, value, arg))
    from .secret_rules import check_override_secrets
    bad += check_override_secrets(out)
    if bad:
        raise SpecError(bad, header="invalid override on the command line")
    return tuple(out)


def apply(raw: dict, overrides: tuple[Override, ...]) -> list[str]:
    """Set each override in raw (creating mappings on the way); notes saying what changed.
    A key through something that is not a mapping is a SpecError naming the override."""
    notes, bad = [], []
    for o in overrides:
        parts = o.key.split(".")
        node: Any = raw
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part) if isinstance(node, dict) else None
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                where = ".".join(parts[:i + 1])
                bad.append(Problem(f"override {o.text}", f"{where} is {nxt!r}, not a mapping; "
                                   f"override {where} itself"))
                break
            node = nxt
        else:
            old = node.get(parts[-1], _UNSET)
            node[parts[-1]] = o.value
            was = "not in the spec" if old is _UNSET else f"the spec says {_short(old)}"
            secret = any(SECRET_NAME.search(part) for part in parts)
            shown, was = ("***", "") if secret else (_short(o.value), f" ({was})")
            notes.append(f"override {o.key}={shown}{was}")
    if bad:
        raise SpecError(bad, header="invalid override on the command line")
    return notes


def name_in(error: SpecError, overrides: tuple[Override, ...]) -> SpecError:
    """error with each problem under an overridden key saying which override set it."""
    if not overrides:
        return error
    problems = []
    for p in error.problems:
        o = next((o for o in overrides if p.path == o.key or p.path.startswith(o.key + ".")
                  or p.path.startswith(o.key + "[")), None)
        problems.append(Problem(p.path, f"{p.message} (set by the override {o.text})") if o else p)
    return SpecError(problems, header=error.header)


_UNSET = object()


def _short(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    text = text[:-4].strip() if text.endswith("\n...") or text.endswith("...") else text
    return text if len(text) <= 60 else text[:57] + "..."

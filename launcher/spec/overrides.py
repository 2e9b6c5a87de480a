"""Command-line overrides of a spec: `KEY.PATH=VALUE` (dotted keys, YAML values), as
llamafactory-cli and OmegaConf's dot-lists take them; applied to the parsed YAML before
validation, so every rule sees the overridden spec."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from ..errors import Problem, SpecError
from .explain import SECRET_NAME, TOKEN_SHAPE
from .inputs import AliasBomb, BoundedLoader

_KEY = re.compile(r"^[A-Za-z_][\w-]*(\.[\w-]+)*$")
# PyYAML (YAML 1.1) reads 1e-5 as a string; a user writing it on a command line means a number.
_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


# Characters no value may hold (spec/load.py refuses them in the spec file); NEL too, which YAML
# reads as a line break.
_LINE_BREAKS = ("\n", "\r", "\0", "\x85")


@dataclass(frozen=True)
class Override:
    """One KEY=VALUE from the command line: the dotted key, the parsed value, the text."""

    key: str
    value: Any
    text: str


def is_override(arg: str) -> bool:
    """An argument of the form KEY=VALUE (a key before the first '=')."""
    return "=" in arg and bool(_KEY.fullmatch(arg.split("=", 1)[0]))


def looks_like_key(arg: str) -> bool:
    """A dotted key alone (`training.learning_rate`): an override missing its =VALUE, not a
    file name (`job.yaml`, `runs/job`: a spec's suffix or a path separator say file)."""
    return bool(_KEY.fullmatch(arg)) and "." in arg and "/" not in arg and \
        not arg.lower().endswith((".yaml", ".yml", ".json"))


def parse(args: tuple[str, ...] | list[str]) -> tuple[Override, ...]:
    """The overrides, or a SpecError naming each argument that is not KEY=VALUE or not YAML."""
    out, bad = [], []
    for arg in args:
        key, sep, text = arg.partition("=")
        if not sep or not _KEY.fullmatch(key):   # fullmatch: `$` would take a trailing newline
            shown = "***" if TOKEN_SHAPE.search(arg) else repr(arg)
            if sep and re.fullmatch(r"[A-Za-z_][\w.]*\[\d*\]", key):
                bad.append(Problem(f"override {shown}", "a list's items are not set one by one; "
                                   f"write the whole list, e.g. {key.partition('[')[0]}='[a, b]'"))
            else:
                bad.append(Problem(f"override {shown}", "not KEY=VALUE; write a dotted key, e.g. "
                                   "training.learning_rate=1e-5"))
            continue
        if any(c in text for c in _LINE_BREAKS):
            # YAML would fold it into a space (`/a\nb` -> `/a b`) and the value change unseen:
            # refused as a newline in a spec value is (spec/load.py _bad_strings).
            bad.append(Problem(f"override {key}", "the value contains a newline or NUL character; "
                               "use a single-line value"))
            continue
        try:
            value = yaml.load(text, Loader=BoundedLoader) if text.strip() else ""
        except AliasBomb as e:
            bad.append(Problem(f"override {key}", str(e)))
            continue
        except yaml.YAMLError as e:
            bad.append(Problem(f"override {_shown(Override(key, None, arg))}", f"the value is not YAML ({' '.join(str(e).split()[:8])}); "
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
        key, why = trainer_key(raw, o.key)
        if why:
            bad.append(Problem(f"override {o.text}", why))
            continue
        alias = f"; {o.key} is {raw.get('trainer')}'s name for it" if key != o.key else ""
        o = Override(key, o.value, o.text)
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
            notes.append(f"override {o.key}={shown}{was[:-1] + alias + ')' if was else alias}")
    if bad:
        raise SpecError(bad, header="invalid override on the command line")
    return notes


def applied_keys(raw: dict, overrides: tuple[Override, ...]) -> tuple[str, ...]:
    """The spec keys the overrides set, in the spec's own names (`learning_rate` on a
    LLaMA-Factory job is training.learning_rate)."""
    return tuple(trainer_key(raw, o.key)[0] or o.key for o in overrides)


def trainer_key(raw: dict, key: str) -> tuple[str, str]:
    """(the spec key, "") for an override written with the trainer's own name for a field
    (LLaMA-Factory's `learning_rate` -> training.learning_rate, ms-swift's `lr` too) that maps
    one to one; ("", why) for a trainer key whose value changes form (bf16 -> precision);
    (key, "") for any other key, which the spec's own rules then judge."""
    trainer = raw.get("trainer") if isinstance(raw, dict) else None
    if "." in key or trainer not in ("llamafactory", "swift"):
        return key, ""
    from .models import TRAINER_MODELS
    fields = {f.alias or n for n, f in TRAINER_MODELS[trainer].model_fields.items()}
    if key in fields:
        return key, ""
    if trainer == "llamafactory":
        from .from_lf import one_to_one
        from .rules import LLAMAFACTORY_OWNED as owned
    else:
        from .swift_rules import SWIFT_OWNED as owned
        one_to_one = _swift_one_to_one
    field = one_to_one(key)
    if field:
        return field, ""
    if key in owned:
        field = owned[key].split()[0]
        return "", (f"{key} is {trainer}'s key for the spec's {owned[key]}, whose value is written "
                    f"differently; override that field, e.g. {field}=... (`mlaunch schema` shows its form)")
    return key, ""


def _swift_one_to_one(key: str) -> str | None:
    from .swift_rules import SWIFT_OWNED
    field = SWIFT_OWNED.get(key)
    return field if field and key not in ("torch_dtype", "bf16", "fp16", "deepspeed", "quant_bits",
                                          "quant_method", "gradient_checkpointing", "tuner_type",
                                          "train_type", "target_modules", "freeze_parameters_ratio") \
        and re.fullmatch(r"[a-z_]+(\.[a-z_]+)?", field) else None


def name_in(error: SpecError, overrides: tuple[Override, ...]) -> SpecError:
    """error with each problem under an overridden key saying which override set it."""
    if not overrides:
        return error
    problems = []
    for p in error.problems:
        # The last override of a key is the one that took effect.
        o = next((o for o in reversed(overrides) if p.path == o.key or p.path.startswith(o.key + ".")
                  or p.path.startswith(o.key + "[")), None)
        problems.append(Problem(p.path, f"{_shell_quoted(p.message, p.path)} (set by the override {_shown(o)})")
                        if o else p)
    return SpecError(problems, header=error.header)


def _shell_quoted(message: str, path: str) -> str:
    """A `quote it, e.g. "1"` fix as an override of the field at path is typed: the shell strips
    quotes it is given bare (KEY="1" reaches mlaunch as KEY=1), so the YAML quotes go inside
    the shell's. A field inside a list or a section the override set whole keeps the plain fix."""
    m = re.search(r'quote it, e\.g\. "(.*)"$', message)
    if not m or "'" in m[1] or "[" in path:
        return message
    return message[:m.start()] + f"""quote it inside the shell's quotes, e.g. '{path}="{m[1]}"'"""


_UNSET = object()


def _shown(o: Override) -> str:
    """The override as typed, its value masked where its key names a secret or it looks like one."""
    secret = SECRET_NAME.search(o.key) or TOKEN_SHAPE.search(o.text)
    return f"{o.key}=***" if secret else o.text


def _short(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    text = text[:-4].strip() if text.endswith("\n...") or text.endswith("...") else text
    return text if len(text) <= 60 else text[:57] + "..."

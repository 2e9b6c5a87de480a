"""Loading a job spec: YAML text -> validated, cross-checked Job, or a SpecError."""
from __future__ import annotations

import difflib
import os
import re
import typing
from typing import Any

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from ..errors import Problem, SpecError
from .models import TRAINER_MODELS, Job, JobBase
from .rules import check_job

SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE", re.I)
_ADAPTER: TypeAdapter | None = None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, which PyYAML would silently collapse."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_spec(path: str) -> JobBase:
    """Read, parse, validate and cross-check the job spec at path."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as e:
        raise SpecError(f"{path}: cannot read: {e.strerror}") from None
    return parse_spec(text, source=path)


def parse_spec(text: str, source: str = "<spec>") -> JobBase:
    """Validate spec text; relative hostfile paths resolve against the source's directory."""
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise SpecError(f"{where}: YAML syntax: {e.problem or e.context}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: expected a mapping of fields at the top level")
    base = os.path.dirname(os.path.abspath(source)) if source != "<spec>" else os.getcwd()
    problems = _expand_hostfile(raw, base)
    _absolute_ds_config(raw, base)
    if problems:
        raise SpecError(problems, header=f"{source}: invalid job spec")
    return validate(raw, source)


def validate(raw: dict, source: str = "<spec>") -> JobBase:
    """Pydantic validation plus the cross-field rules; all problems are reported together."""
    bad = _bad_strings(raw, "")
    if bad:
        raise SpecError(bad, header=f"{source}: invalid job spec")
    model = TRAINER_MODELS.get(raw.get("trainer"))
    try:
        # One model per trainer tag: cheaper to build than the discriminated union's adapter.
        job = model.model_validate(raw) if model else _adapter().validate_python(raw)
    except ValidationError as e:
        raise SpecError(_translate(e, raw), header=f"{source}: invalid job spec") from None
    problems = check_job(job)
    if problems:
        raise SpecError(problems, header=f"{source}: invalid job spec")
    return job


def _adapter() -> TypeAdapter:
    global _ADAPTER
    if _ADAPTER is None:
        _ADAPTER = TypeAdapter(Job)
    return _ADAPTER


def _bad_strings(value: Any, path: str) -> list[Problem]:
    """Newlines and NUL can never be quoted safely into a one-line command: reject them."""
    if isinstance(value, str):
        if "\n" in value or "\r" in value or "\0" in value:
            return [Problem(path, "contains a newline or NUL character; use a single-line value")]
        return []
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _bad_strings(v, _join(path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _bad_strings(v, f"{path}[{i}]")]
    return []


def _expand_hostfile(raw: dict, base: str) -> list[Problem]:
    """Replace cluster.hostfile by the hosts it lists, taking gpus_per_node from slots."""
    cluster = raw.get("cluster")
    if not isinstance(cluster, dict) or "hostfile" not in cluster:
        return []
    if cluster.get("hosts"):
        return [Problem("cluster.hostfile", "give hosts or hostfile, not both")]
    path = os.path.join(base, os.path.expanduser(str(cluster["hostfile"])))
    try:
        with open(path, encoding="utf-8") as fh:
            hosts, slots, problems = parse_hostfile(fh.read(), path)
    except OSError as e:
        return [Problem("cluster.hostfile", f"cannot read {path}: {e.strerror}")]
    cluster["hosts"] = hosts
    distinct = sorted(set(s for s in slots if s is not None))
    if len(distinct) > 1:
        problems.append(Problem("cluster.hostfile", f"slots differ between hosts ({distinct}); "
                                "torchrun starts the same number of processes on every node"))
    elif distinct:
        given = cluster.get("gpus_per_node")
        if given is None:
            cluster["gpus_per_node"] = distinct[0]
        elif given != distinct[0]:
            problems.append(Problem("cluster.gpus_per_node",
                                    f"{given} but the hostfile says slots={distinct[0]}"))
    return problems


def _absolute_ds_config(raw: dict, base: str) -> None:
    """deepspeed.config names a file relative to the spec, like cluster.hostfile."""
    ds = raw.get("deepspeed")
    if isinstance(ds, dict) and isinstance(ds.get("config"), str) and ds["config"]:
        ds["config"] = os.path.join(base, os.path.expanduser(ds["config"]))


def parse_hostfile(text: str, name: str) -> tuple[list[str], list[int | None], list[Problem]]:
    """DeepSpeed hostfile lines: `host [slots=N]`, with # comments and blank lines."""
    hosts, slots, problems = [], [], []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"(\S+)(?:\s+slots\s*=\s*(\d+))?", line)
        if not m:
            problems.append(Problem(f"{name}:{n}", f"expected `host slots=N`, got {line!r}"))
            continue
        hosts.append(m.group(1))
        slots.append(int(m.group(2)) if m.group(2) else None)
    return hosts, slots, problems


def _translate(err: ValidationError, raw: dict) -> list[Problem]:
    """Pydantic errors -> one Problem per field path, with the value given and a fix."""
    out: dict[str, Problem] = {}
    trainer = raw.get("trainer")
    for e in err.errors():
        loc = [x for x in e["loc"] if not _is_type_tag(x)]
        if loc and loc[0] == trainer:
            loc = loc[1:]
        path = ".".join(_fmt_loc(x) for x in loc).replace(".[", "[")
        if e["type"].startswith("union_tag"):
            path, e = "trainer", {**e, "input": trainer}
        if path not in out:
            out[path] = Problem(path, _describe(e, loc, trainer))
    return list(out.values())


def _describe(e: dict, loc: list, trainer: Any) -> str:
    """Human text for one pydantic error."""
    kind, given = e["type"], e.get("input")
    shown = "***" if any(SECRET_NAME.search(str(x)) for x in loc) else repr(given)
    if kind == "extra_forbidden":
        return "unknown key" + _did_you_mean(loc[-1], _known_fields(trainer, loc[:-1]))
    if kind == "missing":
        return "required field missing"
    if kind in ("literal_error", "union_tag_invalid"):
        choices = list(TRAINER_MODELS) if kind == "union_tag_invalid" else _choices(e)
        return (f"{shown} is not one of {', '.join(choices)}"
                + _did_you_mean(str(given), choices))
    if kind == "union_tag_not_found":
        return f"required: one of {', '.join(TRAINER_MODELS)}"
    if kind == "string_pattern_mismatch":
        return f"{shown} must be letters, digits, '.', '_' or '-' (at most 64)"
    return f"{e['msg'].rstrip('.')} (got {shown})"


def _choices(e: dict) -> list[str]:
    """The allowed values of a literal error, from pydantic's "'a', 'b' or 'c'" / "4 or 8"."""
    expected = (e.get("ctx") or {}).get("expected") or e["msg"].removeprefix("Input should be ")
    return [c.strip().strip("'\"") for c in re.split(r",\s*|\s+or\s+", expected) if c.strip()]


def _did_you_mean(word: Any, choices: list[str]) -> str:
    match = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


def _known_fields(trainer: Any, loc: list) -> list[str]:
    """Field names (and aliases) valid at loc, for did-you-mean suggestions."""
    model: Any = TRAINER_MODELS.get(trainer, JobBase)
    for part in loc:
        model = _field_model(model, part)
        if model is None:
            return []
    return [f.alias or n for n, f in model.model_fields.items()]


def _field_model(model: Any, name: Any) -> type[BaseModel] | None:
    field = model.model_fields.get(name) if isinstance(name, str) else None
    if field is None:
        return None
    for cand in [field.annotation, *typing.get_args(field.annotation)]:
        if isinstance(cand, type) and issubclass(cand, BaseModel):
            return cand
    return None


def _is_type_tag(x: Any) -> bool:
    return isinstance(x, str) and bool(re.fullmatch(r"(str|int|float|bool|[\w-]+\[.*\])", x))


def _fmt_loc(x: Any) -> str:
    return f"[{x}]" if isinstance(x, int) else str(x)


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)

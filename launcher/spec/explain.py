"""Pydantic's validation errors as mlaunch's Problem lines: one per field, naming the value
given and the forms the field accepts, with no internal names (constrained-int, list[...])."""
from __future__ import annotations

import difflib
import re
import reprlib
import types
import typing
from typing import Any, Literal, Union

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ValidationError

from ..errors import Problem
from .cluster_spec import NOT_BLANK
from .explain_voice import blank, generic, shown_value
from . import known_args
from .models import TRAINER_MODELS, JobBase
from .owned import LLAMAFACTORY_OWNED, SWIFT_OWNED
from .strict import BoolNumber

SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE", re.I)
# Values shaped like the tokens users paste (Hugging Face, OpenAI-style, GitHub, GitLab, Slack,
# ModelScope-style ms-): masked in an error wherever they were put, whatever the field's name.
TOKEN_SHAPE = re.compile(r"\b(?:hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}"
                         r"|glpat-[A-Za-z0-9_-]{16,}|xox[abprs]-[A-Za-z0-9-]{10,}|ms-[A-Za-z0-9-]{20,})")
# The trainers as their users name them, in the lines about their own argument names.
TRAINER_WORD = {"llamafactory": "LLaMA-Factory", "swift": "ms-swift"}
# A value shown in an error stays one readable line, however large (YAML aliases can nest).
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 8, 8, 160, 160

# Values users bring that a trainer's own stack cannot run, with the reason and the way out.
NOT_OFFERED = {
    ("llamafactory", "stage", "ppo"): (
        "LLaMA-Factory 0.9.5's PPO trainer needs trl 0.8.6-0.9.6 while the rest of 0.9.5 needs "
        "trl >= 0.18 (both are its own version checks), so no one install runs it; for PPO use "
        "trainer: swift with stage: rlhf, rlhf_type: ppo and its reward_model in passthrough"),
}
DS_OWN_JSON = ("is DeepSpeed's own JSON, which mlaunch writes from the spec: save your block to a "
               "file and give `deepspeed: {config: FILE}`, or use `deepspeed: {stage: N}` "
               "(offload_optimizer, offload_param and the tuning fields beside it)")
# Keys that the other trainer spells differently (the README's table of the two).
RENAMED = {
    ("llamafactory", "max_length"): "LLaMA-Factory's name for it is cutoff_len; write "
                                    "`cutoff_len: N` (max_length is ms-swift's)",
    ("swift", "cutoff_len"): "ms-swift's name for it is max_length; write `max_length: N` "
                             "(cutoff_len is LLaMA-Factory's)",
    ("swift", "report_to"): "for ms-swift it is one of its own arguments: write it under passthrough, "
                            "e.g. `passthrough: {report_to: tensorboard}` (top-level report_to is "
                            "LLaMA-Factory's)",
}
# `trainer:` values people bring from other tools, with the trainer that runs them.
OTHER_TRAINER_WORDS = {
    **{w: "any script started by torchrun is `trainer: script` with `script: {path: train.py, args: [...]}`"
       for w in ("torchrun", "torch", "python", "accelerate", "deepspeed", "pytorch", "ddp", "fsdp", "hf", "transformers")},
    **{w: "did you mean 'llamafactory'?" for w in ("llama-factory", "llama_factory", "llamafactory-cli", "lf")},
    **{w: "did you mean 'swift'?" for w in ("ms-swift", "ms_swift", "msswift", "megatron", "megatron-swift")},
}
# Keys written under one section that belong at another place of the spec.
MOVED = {
    "max_restarts": "max_restarts", "restart_backoff_s": "restart_backoff_s", "output_dir": "output_dir",
    "precision": "precision", "report_to": "report_to", "min_nodes": "cluster.min_nodes",
    "nodes": "cluster.hosts (the node list; under Slurm cluster.slurm.nodes)",
    "num_nodes": "cluster.hosts (the node list; under Slurm cluster.slurm.nodes)",
    "nnodes": "cluster.hosts (the node list; under Slurm cluster.slurm.nodes)",
    "nproc_per_node": "cluster.gpus_per_node", "gpus": "cluster.gpus_per_node",
    "num_gpus": "cluster.gpus_per_node", "grad_accum": "batch.grad_accum",
    "per_device": "batch.per_device", "global": "batch.global", "deepspeed": "deepspeed",
    "epochs": "training.epochs", "max_steps": "training.max_steps",
    "learning_rate": "training.learning_rate", "seed": "training.seed",
}
DDP_WHY = ("mlaunch runs plain DDP when `deepspeed` (and `fsdp`) are left out; remove ddp "
           "(and any deepspeed block)")


def translate(err: ValidationError, raw: dict, tagged: bool) -> list[Problem]:
    """Pydantic errors -> one Problem per field path. tagged: validated through the trainer
    union, whose locations start with the trainer tag."""
    trainer = raw.get("trainer")
    out: dict[str, Problem] = {}
    for path, loc, e in _one_branch(err.errors(), trainer if tagged else None):
        if e["type"].startswith("union_tag"):
            path, e = "trainer", {**e, "input": raw if e["type"] == "union_tag_not_found" else trainer}
        if path not in out:
            out[path] = Problem(path, _describe(e, loc, trainer))
    return _drop_missing_named(list(out.values()))


def _one_branch(errors: list[dict], tag: Any) -> list[tuple[str, list, dict]]:
    """(path, loc, error) with a union's branches reduced to what helps: the branch the value
    entered (its errors are inside it), else one "accepted forms" error for the field."""
    groups: dict[tuple, dict[str, list[dict]]] = {}
    plain: list[tuple[tuple, dict]] = []
    for e in errors:
        raw = list(e["loc"][1:] if tag is not None and e["loc"][:1] == (tag,) else e["loc"])
        at = next((i for i, x in enumerate(raw) if _is_type_tag(x)), None)
        if at is None:
            plain.append((tuple(raw), e))
        else:
            groups.setdefault(tuple(raw[:at]), {}).setdefault(raw[at], []).append(e)
    for prefix, branches in groups.items():
        inside = [b for b in branches.values() if any(_depth(e, prefix, tag) for e in b)]
        if inside:
            plain += [(_untagged(e["loc"], tag), e) for e in min(inside, key=len)]
        else:
            first = next(iter(branches.values()))[0]
            plain.append((prefix, {**first, "type": "mlaunch_forms"}))
    return [(_path(list(loc)), list(loc), e) for loc, e in plain]


def _depth(e: dict, prefix: tuple, tag: Any) -> int:
    """How far past the union's branch tag the error lies (0: the value failed the branch's type)."""
    return len(_untagged(e["loc"], tag)) - len(prefix)


def _untagged(loc: tuple, tag: Any) -> tuple:
    loc = loc[1:] if tag is not None and loc[:1] == (tag,) else loc
    return tuple(x for x in loc if not _is_type_tag(x))


def _drop_missing_named(problems: list[Problem]) -> list[Problem]:
    """A misspelt required key gives `missing` and `unknown key; did you mean it`: keep the latter."""
    named = set()
    for p in problems:
        m = re.search(r"unknown key; did you mean '([^']+)'\?", p.message)
        if m:
            named.add(p.path.rpartition(".")[0] + ("." if "." in p.path else "") + m[1])
    return [p for p in problems if not (p.path in named and p.message.startswith("required field missing"))]


def _describe(e: dict, loc: list, trainer: Any) -> str:
    """Human text for one pydantic error."""
    kind, given = e["type"], e.get("input")
    written = getattr(given, "text", None)   # a number as the spec writes it (0123, not 83)
    shown = _masked_env(given) if loc == ["cluster", "env"] else written or _REPR.repr(given)
    shown = shown_value(given, "***" if _secret_at(loc) or TOKEN_SHAPE.search(shown) else shown)
    if isinstance(given, BoolNumber):
        return _generic("int_type", given, shown, loc, trainer, e.get("ctx")).replace(
            f"{shown} is not an integer", f"{shown} is a YAML boolean (true/false/yes/no/on/off), not a number", 1)
    if kind == "extra_forbidden":
        near = _did_you_mean(loc[-1], _known_fields(trainer, loc[:-1]))
        # a near miss of a sibling first; at the top, a trainer's own name before a near miss;
        # a key of another trainer's spec before any near miss (it is no typo: the trainer is)
        return "unknown key" + (_unknown_hint(loc, trainer) or _other_trainer(loc, trainer)
                                or (near if len(loc) > 1 else "")
                                or _trainer_name(loc, trainer) or near or _unknown_fallback(loc, trainer))
    if kind == "mlaunch_forms":
        return _forms_text(shown, trainer, loc)
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return _mapping_text(shown, given, trainer, loc)
    if kind == "string_type" and isinstance(given, (bool, int, float)):
        what = "a YAML boolean (true/false/yes/no/on/off)" if isinstance(given, bool) else "a YAML number"
        return f"{shown} is {what}, not text: quote it, e.g. \"{written or given}\""
    if kind == "literal_error" and loc == ["deepspeed", "name"] and str(given).endswith(".json"):
        return f"{shown} is a file name: write `deepspeed: {{config: {given}}}`"
    if kind in ("literal_error", "union_tag_invalid"):
        choices = list(TRAINER_MODELS) if kind == "union_tag_invalid" else _choices(e)
        why = NOT_OFFERED.get((trainer, ".".join(map(str, loc)), given))
        if kind == "union_tag_invalid" and str(given).lower() in OTHER_TRAINER_WORDS:
            why = OTHER_TRAINER_WORDS[str(given).lower()]
        return (f"{shown} is not one of {', '.join(choices)}"
                + (f": {why}" if why else _did_you_mean(str(given), choices)))
    if kind == "union_tag_not_found":
        typo = difflib.get_close_matches("trainer", [str(k) for k in given or {}], n=1, cutoff=0.6) \
            if isinstance(given, dict) else []
        # `training` is a key of every trainer: a typo only when it is not a valid key itself
        valid = {k for t in TRAINER_MODELS for k in _known_fields(t, [])}
        typo = [t for t in typo if t not in valid]
        return (f"required: one of {', '.join(TRAINER_MODELS)}; add e.g. `trainer: llamafactory`" + (
            f"; did you misspell it as {typo[0]!r}?" if typo else ""))
    if kind == "string_pattern_mismatch" and (e.get("ctx") or {}).get("pattern") == NOT_BLANK:
        leaf = _leaf(trainer, loc)
        return blank(shown, _path(loc), leaf is not None and _allows_none(leaf[0]))
    if kind == "string_pattern_mismatch" and loc == ["cluster", "ssh", "user"]:
        return (f"{shown} is not a user name: write the login name (letters, digits, '.', '_' or "
                "'-', at most 64, not starting with '.' or '-'), e.g. `user: train`, or leave it out")
    if kind == "string_pattern_mismatch":
        return f"{shown} must be letters, digits, '.', '_' or '-' (at most 64)"
    return _generic(kind, given, shown, loc, trainer, e.get("ctx"))


def _generic(kind: str, given: Any, shown: str, loc: list, trainer: Any, ctx: dict | None) -> str:
    """Bounds, types and missing fields, with the forms the field's own type accepts."""
    leaf = _leaf(trainer, loc)
    forms, description = [], None
    if leaf is not None:
        tp, meta, description = leaf
        forms = _forms(tp, meta)
    return generic(kind, given, shown, _path(loc), forms, description, ctx)


def _secret_at(loc: list) -> bool:
    """A value under a secret-named env or passthrough key is shown as ***; a field such as
    ssh.strict_host_keys is not a secret although its name holds KEY."""
    names = [str(x) for x in loc]
    under = names[:2] == ["cluster", "env"] or names[:1] in (["passthrough"], ["script"])
    return under and any(SECRET_NAME.search(x) for x in names[1:])


def _trainer_name(loc: list, trainer: Any) -> str:
    """A trainer's own name for a field this spec holds elsewhere (`gradient_accumulation_steps`,
    or a near miss of it, anywhere): the field to write instead."""
    if trainer not in ("llamafactory", "swift"):
        return ""
    owned = LLAMAFACTORY_OWNED if trainer == "llamafactory" else SWIFT_OWNED
    name = TRAINER_WORD[trainer]
    close = difflib.get_close_matches(str(loc[-1]), list(owned), n=1, cutoff=0.85)
    owner = owned[close[0]] if close else ""
    said = f"{name}'s {close[0]}" if close and close[0] == loc[-1] else f"{close[0]!r} ({name}'s)" if close else ""
    if owner.startswith("--"):
        return f": {said} is mlaunch's {owner} flag; give that on the command line instead"
    if re.fullmatch(r"[a-z_]+(\.[a-z_]+)*", owner) and owner not in (close[0], ".".join(map(str, loc))):
        return f": {said} is {owner} in this spec; write it there"
    return ""


def _other_trainer(loc: list, trainer: Any) -> str:
    """A key unknown only because of the trainer chosen (dataset_dir, LLaMA-Factory's, under
    trainer: swift): whose key it is, and the way out. Not for this trainer's own argument
    names, which go under passthrough (_unknown_fallback)."""
    if trainer not in TRAINER_MODELS or _own_argument(loc, trainer):
        return ""
    owners = [t for t in TRAINER_MODELS if t != trainer and str(loc[-1]) in _known_fields(t, loc[:-1])]
    if not owners:
        return ""
    whose = " and ".join(TRAINER_WORD.get(t, f"trainer {t}") + "'s" for t in owners)
    return (f" for trainer {trainer} (it is {whose}); remove it or set "
            + " or ".join(f"`trainer: {t}`" for t in owners))


def _own_argument(loc: list, trainer: Any) -> bool:
    """Whether the top-level key loc is one of the trainer's own argument names."""
    if len(loc) != 1 or trainer not in ("llamafactory", "swift"):
        return False
    entries = ((known_args._data().get(trainer) or {}).get("entries") or {}).values()
    return any(str(loc[0]) in names for names in entries)


def _unknown_fallback(loc: list, trainer: Any) -> str:
    """The fix for an unknown key nothing else explains: a secret's place, where a trainer's own
    argument goes, else remove it."""
    key = str(loc[-1])
    if SECRET_NAME.search(key):
        return (": a secret goes in cluster.env only (e.g. HF_TOKEN: ${HF_TOKEN}, read from this "
                "shell), where mlaunch masks it; remove it here")
    if _own_argument(loc, trainer):
        return (f": {TRAINER_WORD[trainer]}'s own arguments go under passthrough; write "
                f"passthrough: {{{key}: ...}}")
    return ": remove it, or check its spelling (`mlaunch schema` lists every key)"


def _masked_env(given: Any) -> str:
    """cluster.env given in another shape (a list of NAME=value, as docker-compose allows): shown
    with every secret-named item's value as ***."""
    if isinstance(given, list):
        given = [re.sub(r"=.*", "=***", x, flags=re.S) if isinstance(x, str) and
                 SECRET_NAME.search(x.partition("=")[0]) else x for x in given]
    return "***" if isinstance(given, str) and SECRET_NAME.search(given) else _REPR.repr(given)


def _unknown_hint(loc: list, trainer: Any) -> str:
    """Unknown keys people bring from other launchers' configs, with where they belong."""
    if len(loc) == 2 and loc[0] == "deepspeed" and trainer in ("llamafactory", "swift") and \
            not _did_you_mean(loc[1], _known_fields(trainer, loc[:1])):
        return f": {loc[1]} {DS_OWN_JSON}"
    if loc == ["ddp"] and trainer in ("llamafactory", "swift"):
        return f": {DDP_WHY}"
    if len(loc) == 1 and (trainer, loc[0]) in RENAMED:
        return f": {RENAMED[(trainer, loc[0])]}"
    if loc == ["env"]:
        return ": the environment of every rank is cluster.env; move the block under cluster:"
    place, here = MOVED.get(str(loc[-1])), ".".join(map(str, loc))
    if not place or place.split(" ")[0] == here or (len(loc) == 1 and "." not in place):
        return ""
    if place.startswith("cluster.hosts"):
        return (": the nodes are the list cluster.hosts: [node0, node1] (under Slurm: "
                "cluster.slurm.nodes: N); write that instead")
    if "." not in place:
        return f": {place} is a top-level key; move it out of {loc[0]}:"
    return f": it belongs at {place}; move it there"


def _mapping_text(shown: str, given: Any, trainer: Any, loc: list) -> str:
    """A scalar where a section (mapping) belongs; for deepspeed, the mapping it meant."""
    path = ".".join(map(str, loc))
    if path == "deepspeed" and isinstance(given, str):
        word = given.strip().lower()
        stage = re.fullmatch(r"(?:zero|z|stage)[-_ ]?([0-3])(?:[-_ ].*)?", word)
        if word.endswith(".json"):
            file = re.sub(r"^--deepspeed(?:=|\s+)", "", given.strip())
            return (f"{shown} is a file name: write `deepspeed: {{config: {file}}}`"
                    + ("; mlaunch writes the --deepspeed flag itself" if file != given.strip() else ""))
        if stage:
            off = (", offload_optimizer: cpu" + (", offload_param: cpu" if stage[1] == "3" else "")
                   if "offload" in word else "")
            return f"{shown} is a ZeRO stage: write `deepspeed: {{stage: {stage[1]}{off}}}`"
    if path == "cluster.env" and isinstance(given, list):
        return (f"{shown} is a list: write one NAME: value per line under cluster.env (a mapping), "
                "e.g. NCCL_DEBUG: WARN; a secret as HF_TOKEN: ${HF_TOKEN}")
    names = _known_fields(trainer, loc)[:4]
    fields = f" ({', '.join(names)}, ...)" if names else ""
    return f"{shown} is not a mapping: write {path}: {{key: value}} with its fields{fields}"


def _forms_text(shown: str, trainer: Any, loc: list) -> str:
    """`'two' is not accepted: write an integer from 1 to 1024, or a list of them` from the type."""
    leaf = _leaf(trainer, loc)
    if leaf is None:
        return f"{shown} is not accepted here"
    tp, meta, description = leaf
    forms = _forms(tp, meta) + (["leave it out"] if _allows_none(tp) else [])
    text = f"{shown} is not accepted: write " + ", or ".join(forms)
    return text + (f"; {description}" if description else "")


def _forms(tp: Any, meta: list | tuple = ()) -> list[str]:
    """The accepted forms of a type, in words."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(tp)
        return _forms(base, [m for x in extra for m in getattr(x, "metadata", [x])])
    if origin in (Union, types.UnionType):
        out: list[str] = []
        for a in typing.get_args(tp):
            if a is not type(None):
                here = _forms(a, meta)
                # `int | list[int]`: "an integer, or a list of them"
                same = typing.get_origin(a) is list and out and _forms(typing.get_args(a)[0]) == out[-1:]
                out += ["a list of them"] if same else here
        return out
    if origin is Literal:
        return [" or ".join(map(str, typing.get_args(tp)))]
    if origin is list:
        return [f"a list, each {' or '.join(_forms(typing.get_args(tp)[0]))}"]
    if origin is dict:
        return ["a mapping"]
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return ["a mapping of its fields"]
    names = {int: "an integer", float: "a number", str: "text", bool: "true or false"}
    return [names.get(tp, getattr(tp, "__name__", str(tp))) + _bounds(meta)]


def _bounds(meta) -> str:
    """` from 1 to 1024`, ` ≥ 1`, ` > 0`: the numeric constraints of a Field."""
    ge = next((m.ge for m in meta if isinstance(m, Ge)), None)
    le = next((m.le for m in meta if isinstance(m, Le)), None)
    if ge is not None and le is not None:
        return f" from {ge} to {le}"
    parts = [f"{sym} {getattr(m, attr)}" for m in meta for cls, sym, attr in
             ((Ge, "≥", "ge"), (Gt, ">", "gt"), (Le, "≤", "le"), (Lt, "<", "lt")) if isinstance(m, cls)]
    return "".join(f" {x}" for x in parts)


def _allows_none(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType) and type(None) in typing.get_args(tp)


def _leaf(trainer: Any, loc: list) -> tuple[Any, list, str | None] | None:
    """(type, constraints, description) of the value at loc, through models, dicts and lists."""
    tp: Any = TRAINER_MODELS.get(trainer, JobBase)
    meta: list = []
    description = None
    for part in loc:
        tp = _container(tp, part)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = next((f for n, f in tp.model_fields.items() if part in (n, f.alias)), None)
            if field is None:
                return None
            tp, meta, description = field.annotation, field.metadata, field.description
        elif typing.get_origin(tp) in (dict, list):
            tp, meta, description = typing.get_args(tp)[-1], [], None
        else:
            return None
    return tp, meta, description


def _container(tp: Any, part: Any) -> Any:
    """The model, dict or list inside Annotated / Optional wrappers that `part` indexes."""
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) not in (Union, types.UnionType):
        return tp
    want = (list,) if isinstance(part, int) else (dict,)
    for a in typing.get_args(tp):
        if (isinstance(a, type) and issubclass(a, BaseModel) and isinstance(part, str)) or \
                typing.get_origin(a) in want:
            return a
    return tp


def _choices(e: dict) -> list[str]:
    """The allowed values of a literal error, from pydantic's "'a', 'b' or 'c'" / "4 or 8"."""
    expected = (e.get("ctx") or {}).get("expected") or e["msg"].removeprefix("Input should be ")
    return [c.strip().strip("'\"") for c in re.split(r",\s*|\s+or\s+", expected) if c.strip()]


def _did_you_mean(word: Any, choices: list[str]) -> str:
    same_case = [c for c in choices if c.lower() == str(word).lower()]   # `LoRA` for lora
    match = same_case or difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
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
    return isinstance(x, str) and bool(re.fullmatch(r"(str|int|float|bool|[\w-]+\[.*\]|constrained-\w+)", x))


def _path(loc: list) -> str:
    return ".".join(f"[{x}]" if isinstance(x, int) else str(x) for x in loc).replace(".[", "[")

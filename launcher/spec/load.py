"""Loading a job spec: YAML text -> validated, cross-checked Job, or a SpecError."""
from __future__ import annotations

import os
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from ..errors import Problem, SpecError
from .hosts import parse_hostfile
from .inputs import AliasBomb, BoundedLoader, read_input, read_stream
from .explain import NOT_OFFERED, SECRET_NAME, translate  # noqa: F401  (importable from here)
from .models import TRAINER_MODELS, Job, JobBase
from .check import check_job
from .ds_rules import ddp_option_notes
from .rules import node_path_notes, output_dir_note
from .secret_rules import env_refs, resolve_env_refs
from .select import select

_ADAPTER: TypeAdapter | None = None


class _UniqueKeyLoader(BoundedLoader):
    """SafeLoader that rejects duplicate keys, which PyYAML would silently collapse (and
    bounds aliases: spec/inputs.py)."""


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


def load_spec(path: str, overrides: tuple = ()) -> JobBase:
    """Read, parse, validate and cross-check the job spec at path ("-": standard input);
    overrides: spec.overrides.Override from the command line, applied before validation."""
    if path == "-":
        import sys
        data = read_stream(getattr(sys.stdin, "buffer", sys.stdin), "spec")
        text = data if isinstance(data, str) else _decode(data, "<stdin>", "spec")
        return parse_spec(text, source="<stdin>", overrides=overrides)
    try:
        return parse_spec(read_text(path, "spec"), source=path, overrides=overrides)
    except SpecError as e:
        raise _one_line(e, path) from None


def shown_path(path: str) -> str:
    """path as printed: repr-escaped when a newline or other control character would split
    or garble its line."""
    return path if path.isprintable() else repr(path)


def _one_line(e: SpecError, path: str) -> SpecError:
    """e with path (and any other control character in its lines) escaped: one line each."""
    if path.isprintable():
        return e

    def fix(text: str | None) -> str | None:
        return text and "".join(c if c.isprintable() else repr(c)[1:-1]
                                for c in text.replace(path, shown_path(path)))
    e.header = fix(e.header)
    e.problems = [Problem(p.path, fix(p.message)) for p in e.problems]
    e.args = ("\n".join(e.lines()),)
    return e


def read_text(path: str, what: str) -> str:
    """A UTF-8 text file, or a SpecError naming the file (and the first bad byte's offset).
    Only a regular file within the spec's size cap (spec/inputs.py: no FIFO, no /dev/zero)."""
    return _decode(read_input(path, what), path, what)


def _decode(data: bytes, path: str, what: str) -> str:
    """data as UTF-8 text, or a SpecError naming the first bad byte's offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start}; "
                        f"save the {what} as UTF-8") from None


def parse_spec(text: str, source: str = "<spec>", overrides: tuple = ()) -> JobBase:
    """Validate spec text; relative hostfile paths resolve against the source's directory."""
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise SpecError(f"{where}: YAML syntax: {e.problem or e.context}; {_yaml_fix(e)}") from None
    except AliasBomb as e:
        raise SpecError(f"{source}: {e}") from None
    except yaml.reader.ReaderError as e:  # a control character such as NUL: binary?
        code = e.character if isinstance(e.character, int) else ord(e.character)
        raise SpecError(f"{source}: character U+{code:04X} at character offset {e.position} is "
                        "not allowed in YAML; is this a binary file? give the spec as text") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{source}: not YAML text: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise SpecError(f"{source}: YAML nested too deeply to be a job spec") from None
    if not isinstance(raw, dict):
        kind = "empty" if raw is None else f"a YAML {type(raw).__name__}"
        raise SpecError(f"{source}: the spec is {kind}; expected a mapping of fields "
                        "(name:, cluster:, trainer:, ...) at the top level")
    from . import overrides as ov
    from .staging import absolute_sources
    _refuse_llamafactory_yaml(raw, source)
    keys = ov.applied_keys(raw, overrides)
    changed = ov.apply(raw, overrides)
    base = os.path.dirname(os.path.abspath(source)) if not source.startswith("<") else os.getcwd()
    read_here = _launcher_file_notes(raw)   # before they are made absolute below
    problems, notes = _expand_hostfile(raw, base)
    notes = changed + notes
    _absolute_ds_config(raw, base)
    absolute_sources(raw, base)
    notes = read_here + notes
    if problems:
        raise ov.name_in(SpecError(problems, header=f"{source}: invalid job spec"), overrides)
    try:
        job = validate(raw, source, notes)
    except SpecError as e:
        raise ov.name_in(e, overrides) from None
    job._overridden = keys
    return job


def _yaml_fix(e: yaml.MarkedYAMLError) -> str:
    """What to do about a YAML error at its mark."""
    problem = str(e.problem or e.context)
    if "another document" in problem:
        return "one document per spec: remove the second `---` and what follows it"
    if "constructor for the tag" in problem:
        return "tags (!!python/..., !name) are not accepted: write a plain value"
    if problem.startswith("duplicate key"):
        return "keep one of them"
    return "fix the YAML at that line and column (check indentation and quoting)"


def _refuse_llamafactory_yaml(raw: dict, source: str) -> None:
    """A LLaMA-Factory YAML given as is: where each of its keys goes, and the command that
    writes the spec from it, instead of `trainer: required` and a line per unknown key."""
    from .from_lf import LlamaFactoryYaml, looks_like_llamafactory, places
    if looks_like_llamafactory(raw):
        shown = source if not source.startswith("<") else "lf.yaml"
        raise LlamaFactoryYaml(places(raw), header=(
            f"{source}: a LLaMA-Factory YAML, not an mlaunch job spec; `mlaunch init "
            f"--from-llamafactory {shown} --hosts HOST1,HOST2 --gpus-per-node N > job.yaml` writes "
            "the spec. Where each key goes:"))


def validate(raw: dict, source: str = "<spec>", notes: list[str] | None = None,
             secret_env: frozenset[str] | tuple = ()) -> JobBase:
    """Pydantic validation, host selection and the cross-field rules; all problems together.

    secret_env: cluster.env names that are secrets besides those written `${NAME}` here (a
    spec validated again after its references were resolved: the supervisor's, preflight's)."""
    refs = env_refs(raw) | frozenset(secret_env)
    raw, bad = resolve_env_refs(raw)
    bad += _bad_strings(raw, "")
    if bad:
        raise SpecError(bad, header=f"{source}: invalid job spec")
    model = TRAINER_MODELS.get(raw.get("trainer"))
    try:
        # One model per trainer tag: cheaper to build than the discriminated union's adapter.
        job = model.model_validate(raw) if model else _adapter().validate_python(raw)
    except ValidationError as e:
        raise SpecError(translate(e, raw, tagged=model is None), header=f"{source}: invalid job spec") from None
    job._secret_env = refs
    update, problems, selected = select(job.cluster)
    if update:
        job = job.model_copy(update={"cluster": job.cluster.model_copy(update=update)})
    problems = problems or check_job(job)
    if problems:
        raise SpecError(problems, header=f"{source}: invalid job spec")
    where = output_dir_note(job)
    job._notes = (tuple(notes or ()) + tuple(selected) + ((where,) if where else ())
                  + tuple(node_path_notes(job)) + tuple(ddp_option_notes(job)) + tuple(_secret_notes(job)))
    return job


def _secret_notes(job: JobBase) -> list[str]:
    """A secret written into the spec (masked everywhere mlaunch prints it, but the file holds
    it), and one read from this shell empty: said, not refused."""
    from .secret_rules import secret_name
    out = []
    for name, value in job.cluster.env.items():
        if not secret_name(name):   # HF_TOKEN, WANDB_API_KEY; not TOKENIZERS_PARALLELISM
            continue
        if name not in job._secret_env and value:
            out.append(f"cluster.env.{name} is written in the spec: mlaunch masks it everywhere it "
                       f"prints or stores it, but the file holds it; `{name}: ${{{name}}}` reads it "
                       "from the shell that runs mlaunch instead")
        elif name in job._secret_env and not value:
            out.append(f"cluster.env.{name} is empty in this shell: the nodes get it empty")
    return out


def _adapter() -> TypeAdapter:
    global _ADAPTER
    if _ADAPTER is None:
        _ADAPTER = TypeAdapter(Job)
    return _ADAPTER


def _bad_strings(value: Any, path: str, seen: set[int] | None = None) -> list[Problem]:
    """Newlines and NUL can never be quoted safely into a one-line command: reject them.

    A YAML alias repeats one object, not a copy: each container is visited once, or nine
    nested nine-fold aliases (a "billion laughs") would take 9^9 steps.
    """
    if isinstance(value, str):
        if "\n" in value or "\r" in value or "\0" in value:
            return [Problem(path, "contains a newline or NUL character; use a single-line value")]
        return []
    if not isinstance(value, (dict, list)):
        return []
    seen = set() if seen is None else seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _bad_strings(v, _join(path, k), seen)]
    return [p for i, v in enumerate(value) for p in _bad_strings(v, f"{path}[{i}]", seen)]


def _expand_hostfile(raw: dict, base: str) -> tuple[list[Problem], list[str]]:
    """Replace cluster.hostfile by the hosts it lists, taking gpus_per_node from slots."""
    cluster = raw.get("cluster")
    if not isinstance(cluster, dict) or not isinstance(cluster.get("hostfile"), str):
        return [], []  # no hostfile, or not a path: pydantic names the type
    if cluster.get("scheduler") == "slurm":
        return [Problem("cluster.hostfile", "with scheduler slurm the nodes come from the "
                        "allocation; remove hostfile and set cluster.slurm.nodes")], []
    if cluster.get("scheduler") == "ray":
        return [Problem("cluster.hostfile", "with scheduler ray the nodes are bundles Ray "
                        "places; remove hostfile and set cluster.ray.nodes")], []
    if cluster.get("hosts"):
        return [Problem("cluster.hostfile", "give hosts or hostfile, not both")], []
    path = os.path.join(base, os.path.expanduser(str(cluster["hostfile"])))
    try:
        hosts, slots, problems, notes = parse_hostfile(read_text(path, "hostfile"), path,
                                                       f"hostfile {cluster['hostfile']}")
    except SpecError as e:
        return [Problem("cluster.hostfile", str(e.problems[0]))], []
    cluster["hosts"] = hosts
    if problems or not hosts:
        return problems or [Problem("cluster.hostfile", f"{path} lists no hosts")], notes
    return _slots_to_procs(cluster, hosts, slots), notes


def _slots_to_procs(cluster: dict, hosts: list[str], slots: list[int | None]) -> list[Problem]:
    """gpus_per_node from the slots: one count if all agree, else one per host.

    A line without slots= takes gpus_per_node, which must then be given; where both are
    given they must agree.
    """
    given = cluster.get("gpus_per_node")
    if all(s is None for s in slots):
        return []
    if isinstance(given, list):
        if len(given) == len(slots) and all(s in (None, g) for s, g in zip(slots, given)):
            return []
        return [Problem("cluster.gpus_per_node", f"{_short(given)} but the hostfile's slots are "
                        f"{_short(slots)}; remove gpus_per_node (the slots give it)")]
    if given is not None:
        bad = next((s for s in slots if s not in (None, given)), None)
        if bad is None:
            return []
        return [Problem("cluster.gpus_per_node", f"{given} but the hostfile says slots={bad}; "
                        "remove gpus_per_node (the slots give it) or make them agree")]
    if None in slots:
        host = hosts[slots.index(None)]
        return [Problem("cluster.gpus_per_node", f"required: the hostfile line of {host} has no "
                        "slots=N; add slots= to every line, or give gpus_per_node")]
    cluster["gpus_per_node"] = slots[0] if len(set(slots)) == 1 else slots
    return []


def _short(values: list) -> str:
    return str(values) if len(values) <= 8 else f"[{', '.join(map(str, values[:8]))}, …] ({len(values)})"


def _absolute_ds_config(raw: dict, base: str) -> None:
    """deepspeed.config names a file relative to the spec, like cluster.hostfile."""
    ds = raw.get("deepspeed")
    if isinstance(ds, dict) and isinstance(ds.get("config"), str) and ds["config"].strip():
        ds["config"] = os.path.join(base, os.path.expanduser(ds["config"]))


def _launcher_file_notes(raw: dict) -> list[str]:
    """Files mlaunch reads itself (hostfile, deepspeed.config) given relative: read beside the
    spec, whatever directory mlaunch runs from."""
    cluster, ds = raw.get("cluster"), raw.get("deepspeed")
    given = [("cluster.hostfile", cluster.get("hostfile") if isinstance(cluster, dict) else None),
             ("deepspeed.config", ds.get("config") if isinstance(ds, dict) else None)]
    return [f"{name} {value!r} is relative: mlaunch reads it from the spec's directory"
            for name, value in given if isinstance(value, str) and value.strip()
            and not value.startswith(("/", "~"))]


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)

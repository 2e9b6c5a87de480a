"""`mlaunch init --from-llamafactory LF.yaml --hosts a,b --gpus-per-node N`: an mlaunch job spec
written from a LLaMA-Factory training YAML (spec/from_lf.py), checked as validate checks it."""
from __future__ import annotations

import os
import sys

import click
import yaml

from ..errors import UserError


@click.command("init")
@click.option("--from-llamafactory", "lf_yaml", metavar="LF.yaml",
              help="A LLaMA-Factory training YAML (what `llamafactory-cli train` takes).")
@click.option("--from-swift", "swift_cmd", metavar="'swift sft ...'",
              help="An ms-swift command line, as one argument (swift sft|pt|rlhf, megatron sft|pt|rlhf).")
@click.option("--hosts", required=True, help="The nodes, comma-separated: node0,node1.")
@click.option("--gpus-per-node", required=True, type=click.IntRange(1, 1024), help="GPUs of each node.")
@click.option("--name", help="The job's name (default: the YAML's file name).")
@click.option("--workdir", help="Where every node works: a relative output_dir resolves in it "
              "(default: this directory, as llamafactory-cli run here would).")
def init_cmd(lf_yaml: str | None, swift_cmd: str | None, hosts: str, gpus_per_node: int, name: str | None,
             workdir: str | None) -> None:
    """Write an mlaunch job spec from a LLaMA-Factory YAML (or an ms-swift command line) to stdout
    (save it: > job.yaml).

    Each key goes to its spec field (per_device_train_batch_size -> batch.per_device, bf16 ->
    precision: bf16); keys the spec has no field for go to passthrough unchanged. The spec is
    validated; its problems, if any, follow on stderr (exit 2)."""
    if (lf_yaml is None) == (swift_cmd is None):
        raise UserError("init: give --from-llamafactory LF.yaml or --from-swift 'swift sft ...' (one of them)")
    names = [h.strip() for h in hosts.split(",") if h.strip()]
    if not names:
        raise UserError("--hosts: no host given; write --hosts node0,node1")
    if swift_cmd is not None:
        from ..spec import from_swift
        stage, megatron, args = from_swift.parse_command(swift_cmd)
        spec, notes = from_swift.to_spec(stage, megatron, args, names, gpus_per_node, name or "swift-job")
        out_dir = str(spec.get("output_dir", ""))
        if not out_dir.startswith(("/", "~")):   # as `swift sft` run here would resolve it
            spec["cluster"]["workdir"] = workdir or os.getcwd()
            notes.append(f"cluster.workdir: {spec['cluster']['workdir']}, where the relative output_dir "
                         f"{out_dir} resolves; every node must see it (shared storage), or change it")
        _write(spec, notes, f"--from-swift '{' '.join(swift_cmd.split()[:2])} ...'")
        return
    from ..spec.from_lf import looks_like_llamafactory, to_spec
    from ..spec.load import _UniqueKeyLoader, read_text
    try:
        raw = yaml.load(read_text(lf_yaml, "LLaMA-Factory YAML"), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        raise UserError(f"{lf_yaml}: not YAML: {' '.join(str(e).split())}") from None
    if not looks_like_llamafactory(raw):
        raise UserError(f"{lf_yaml}: not a LLaMA-Factory training YAML (no model_name_or_path with "
                        "stage or finetuning_type, or it has trainer:); for an mlaunch spec run "
                        f"mlaunch validate {lf_yaml}")
    job_name = name or _name_of(lf_yaml)
    spec, notes = to_spec(raw, names, gpus_per_node, job_name, os.path.dirname(os.path.abspath(lf_yaml)),
                          workdir or os.getcwd())
    _write(spec, notes, f"--from-llamafactory {lf_yaml}")


def _write(spec: dict, notes: list[str], source: str) -> None:
    """The spec on stdout (notes as comments on top), then validate's problems on stderr."""
    head = [f"# mlaunch job spec written by `mlaunch init {source}`"]
    head += [f"# {n}" for n in notes]
    click.echo("\n".join(head) + "\n" + yaml.safe_dump(spec, sort_keys=False, width=100), nl=False)
    problems = _problems(spec)
    for line in problems:
        click.echo(f"mlaunch: {line}", err=True)
    sys.exit(2 if problems else 0)


def _name_of(path: str) -> str:
    """A job name from the file name: letters, digits, '.', '_', '-' (spec.models' pattern)."""
    stem = os.path.splitext(os.path.basename(path))[0]
    clean = "".join(c if c.isalnum() or c in "._-" else "-" for c in stem).lstrip("._-")
    return (clean or "job")[:64]


def _problems(spec: dict) -> list[str]:
    """What validate would say of the written spec (nothing: it validates)."""
    import copy

    from ..spec import validate
    from ..runs.attempts import SubmitOptions, check_offline
    try:
        check_offline(validate(copy.deepcopy(spec), "<init>"), SubmitOptions())
    except UserError as e:
        return e.lines(None)
    return []

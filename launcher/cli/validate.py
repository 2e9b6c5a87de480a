"""`mlaunch validate JOB... [KEY=VALUE]...`: each spec checked as submit checks it before
connecting (submit.check_offline: the fields, the options, a batch that will not fit)."""
from __future__ import annotations

import json
import os

import click

from ..errors import UserError


def validate_all(args: tuple[str, ...], as_json: bool) -> int:
    """Validate every JOB of args (KEY=VALUE arguments override each); 0 if all are ok, else 2.

    One JOB: its problems raise as any command's do. Several: each file's verdict in turn,
    problems on stderr, so one bad spec does not hide the next one's."""
    jobs = [a for i, a in enumerate(args) if not _meant_as_override(a, first=i == 0)]
    overrides = tuple(a for i, a in enumerate(args) if _meant_as_override(a, first=i == 0))
    if not jobs:
        raise UserError("validate: no JOB given (only KEY=VALUE overrides); give a spec file or -")
    if jobs.count("-") > 1:
        raise UserError("validate: - (standard input) given twice; it can be read once")
    results = [_one(job, overrides, raise_it=len(jobs) == 1 and not as_json) for job in jobs]
    if as_json:
        click.echo(json.dumps(results if len(jobs) > 1 else results[0], indent=2))
    return 0 if all(r["ok"] for r in results) else 2


def _meant_as_override(arg: str, first: bool) -> bool:
    """Whether arg is a KEY=VALUE override (or a try at one) rather than a JOB file.

    A file that exists is a JOB whatever its name. Any argument KEY=VALUE is an override;
    after the first, so is any other one with a '=' (`=x`, `lr =1e-5`) and a dotted key
    without one (`training.learning_rate`), which are malformed overrides: parse() says so
    as plan and submit do, rather than "cannot read the spec" for a file never meant."""
    from ..spec.overrides import is_override, looks_like_key
    if arg == "-" or os.path.exists(arg):
        return False
    if is_override(arg):
        return True
    return not first and ("=" in arg or looks_like_key(arg))


def _one(job: str, overrides: tuple[str, ...], raise_it: bool) -> dict:
    """The verdict on one JOB as a dict; printed unless JSON is asked for (the caller prints)."""
    from ..spec import load_spec
    from ..spec.load import shown_path
    from ..spec.overrides import parse
    from ..runs.attempts import SubmitOptions, check_offline
    name = "<stdin>" if job == "-" else job
    try:
        check_path(job)
        spec = load_spec(job, parse(overrides))
        check_offline(spec, SubmitOptions())
    except UserError as e:
        if raise_it:
            raise
        if not _json_wanted():
            for line in e.lines():
                click.echo(f"mlaunch: {line}", err=True)
        return {"job": name, "ok": False, "problems": [str(p) for p in e.problems],
                "header": e.header}
    summary = _summary(spec)
    if not _json_wanted():
        for note in spec._notes:
            click.echo(f"note: {note}")
        click.echo(f"{shown_path(name)}: ok ({summary})")
    return {"job": name, "ok": True, "trainer": spec.trainer, "summary": summary,
            "notes": list(spec._notes)}


def say_overrides(spec, err: bool = False) -> None:
    """One `note: override ...` line per command-line override, as validate and submit say them
    (err: on stderr, where stdout is the command's own output)."""
    for note in spec._notes:
        if note.startswith("override "):
            click.echo(f"note: {note}", err=err)


def check_path(value: str) -> None:
    """A directory given as JOB, refused in mlaunch's voice (one line, exit 2)."""
    if value != "-" and os.path.isdir(value):
        from ..spec.load import shown_path
        specs = sorted(f for f in os.listdir(value) if f.endswith((".yaml", ".yml", ".json")))[:3]
        hint = f" (it holds {', '.join(specs)})" if specs else ""
        raise UserError(f"JOB {shown_path(value)}: a directory, not a job spec file{hint}; give "
                        "the spec's YAML file, e.g. mlaunch validate configs/quickstart.yaml")


def _summary(spec) -> str:
    """trainer, the world, and the scheduler when there is one: what validate's ok line says."""
    from ..spec import world_text
    via = f", {spec.cluster.scheduler}" if spec.cluster.scheduler != "ssh" else ""
    return f"{spec.trainer}, {world_text(spec.cluster, 'processes')}{via}"


def _json_wanted() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.params.get("as_json"))

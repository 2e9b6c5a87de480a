"""`mlaunch plan JOB`: the memory estimate and the batch numbers a launch would use.

Registered in launcher/cli/main.py with one line. Connects nowhere: GPU memory comes
from cluster.gpu_memory_gb (or an assumption it names), the model's config.json from this
machine.
"""
from __future__ import annotations

import json

import click

from ..errors import UserError


@click.command("plan")
@click.argument("job", type=click.Path(), metavar="JOB")
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
@click.option("--force-unfit", "--force", "force", is_flag=True,
              help="Exit 0 although the estimate says the batch will not fit (it is printed either way).")
def plan_cmd(job: str, overrides: tuple[str, ...], as_json: bool, force: bool) -> None:
    """Estimate per-GPU memory and show the micro-batch, accumulation and checkpointing."""
    from ..plan import meminputs
    from ..view import memview
    from ..spec import load_spec
    from ..spec.overrides import parse
    from ..runs.attempts import SubmitOptions, check_offline
    from .validate import check_path, say_overrides
    check_path(job)
    spec = load_spec(job, parse(overrides))
    say_overrides(spec, err=as_json)

    def show(decision) -> None:
        if decision is None:
            raise UserError(f"{job}: trainer {spec.trainer} has no batch to plan")
        if as_json:
            click.echo(json.dumps(memview.to_dict(decision), indent=2))
        else:
            click.echo("\n".join(memview.lines(decision)))
    # The same refusal as validate, render, --dry-run and submit (before it connects).
    check_offline(spec, SubmitOptions(force=force), unasked=meminputs.PLAN, shown=show)


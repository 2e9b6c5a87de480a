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
@click.argument("job", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
@click.option("--force", is_flag=True, help="Exit 0 even when the estimate says it will not fit.")
def plan_cmd(job: str, as_json: bool, force: bool) -> None:
    """Estimate per-GPU memory and show the micro-batch, accumulation and checkpointing."""
    from ..plan import meminputs
    from ..view import memview
    from ..plan.batch import refuse_unfit, resolve
    from ..spec import load_spec
    spec = load_spec(job)
    decision = resolve(spec, meminputs.inputs(spec, unasked=meminputs.PLAN))
    if decision is None:
        raise UserError(f"{job}: trainer {spec.trainer} has no batch to plan")
    if as_json:
        click.echo(json.dumps(memview.to_dict(decision), indent=2))
    else:
        click.echo("\n".join(memview.lines(decision)))
    refuse_unfit(decision, force)

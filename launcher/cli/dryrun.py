"""`mlaunch submit --dry-run`: what submit would run, printed (or as JSON); connects nowhere.

Called by launcher/cli/main.py after runs.attempts.check_offline has refused what submit would refuse."""
from __future__ import annotations

import json

import click

from ..errors import UserError


def dry_run(spec, opts, decision, full: bool = False, as_json: bool = False) -> None:
    """Print the plan submit would run with opts: the backend's view, or with as_json a dict."""
    from ..backends import backend_of
    from ..view.plandata import plan_data
    explicit = opts.resume if opts.resume not in (None, "latest", "auto") else None
    if opts.max_restarts is not None:  # the dry-run shows the policy the launch would follow
        spec = _with(spec, max_restarts=opts.max_restarts)
    backend = backend_of(spec)
    if backend.name == "local":
        _refuse_local_clobber(spec, opts)
    plan = backend.plan(spec, run_id=opts.run_id, log_dir=opts.log_dir, overwrite=opts.overwrite,
                        resume_from=explicit, memory=decision.inputs if decision else None)
    if as_json:
        click.echo(json.dumps(plan_data(plan, backend.name, resume=opts.resume), indent=2))
        return
    click.echo(backend.dryrun(plan, full=full).text, nl=False)
    if opts.resume and not explicit:
        click.echo("resume: from the latest complete checkpoint found at launch (dry run looks nowhere)")
    if _sets_aside(spec, opts):
        click.echo(f"output_dir: before each attempt, the checkpoint-N folders it may save again (all of "
                   f"them at this fresh start; above the resumed step on a restart) are moved into "
                   f"{spec.output_dir.rstrip('/')}/mlaunch-set-aside/<run>-attempt<k>/, nothing deleted")


def _refuse_local_clobber(spec, opts) -> None:
    """Nodes on this machine: output_dir is here, so the dry run refuses what submit would, a
    fresh start over checkpoints already there (runs/outputdir.py starting_point); elsewhere the
    dry run looks nowhere and submit decides at launch."""
    import os
    from ..nodeprog.checkpoints import has_checkpoints
    from ..plan.trainers import TRAINERS
    if opts.resume or opts.overwrite or not spec.output_dir or not TRAINERS[spec.trainer].resumable:
        return
    path = os.path.expanduser(spec.output_dir)
    if spec.cluster.workdir and not os.path.isabs(path):   # where the nodes open it
        path = os.path.join(os.path.expanduser(spec.cluster.workdir), path)
    if has_checkpoints(path):
        from ..runs.outputdir import clobber_line
        raise UserError(clobber_line(spec.output_dir) + " (submit would refuse the same)")


def _sets_aside(spec, opts) -> bool:
    """Whether submit would move older checkpoint folders out of the way (runs/outputdir.py
    clear_way) on a fresh start over them: said, since the dry run looks nowhere."""
    from ..plan.trainers import TRAINERS
    trainer = TRAINERS[spec.trainer]
    return bool(opts.overwrite and spec.output_dir and trainer.resumable and trainer.saves_in_output_dir(spec)
                and not getattr(spec, "checkpoints", None))


def _with(spec, **update):
    """spec with fields replaced, its notes kept."""
    copy = spec.model_copy(update=update)
    copy._notes = spec._notes
    return copy



"""`mlaunch submit --dry-run`: what submit would run, printed (or as JSON); connects nowhere.

Called by launcher/cli/main.py after launch.attempts.check_offline has refused what submit would refuse."""
from __future__ import annotations

import json

import click


def dry_run(spec, opts, decision, full: bool = False, as_json: bool = False) -> None:
    """Print the plan submit would run with opts: the backend's view, or with as_json a dict."""
    from ..launch.backends import backend_for, backend_name
    from ..plan.launch_plan import build_plan
    explicit = opts.resume if opts.resume not in (None, "latest", "auto") else None
    if opts.max_restarts is not None:  # the dry-run shows the policy the launch would follow
        spec = _with(spec, max_restarts=opts.max_restarts)
    plan = build_plan(spec, run_id=opts.run_id, log_dir=opts.log_dir, overwrite=opts.overwrite,
                      resume_from=explicit, memory=decision.inputs if decision else None)
    if as_json:
        click.echo(json.dumps(plan_dict(plan, resume=opts.resume), indent=2))
        return
    click.echo(backend_for(backend_name(plan)).dryrun(plan, full=full).text, nl=False)
    if opts.resume and not explicit:
        click.echo("resume: from the latest complete checkpoint found at launch (dry run looks nowhere)")


def _with(spec, **update):
    """spec with fields replaced, its notes kept."""
    copy = spec.model_copy(update=update)
    copy._notes = spec._notes
    return copy


def plan_dict(plan, resume: str | None = None) -> dict:
    """The dry-run as data: the nodes (argv, environment beyond mlaunch's own, secrets masked),
    the files, the batch decision, the restart policy and the notes. Every string of it goes
    through plan.mask's function (mask_data), as the text dry-run's whole text does: no field
    can print a secret the text would mask."""
    from ..view import memview
    from ..view.dryrun import user_env
    from ..launch.backends import backend_name
    from ..spec.spare_rules import shrinks
    from ..spec.secret_rules import mask_data
    from ..plan.launch_plan import MASK
    job = plan.job
    return mask_data({
        "job": job.name, "run_id": plan.run_id, "backend": backend_name(plan),
        "trainer": job.trainer, "notes": list(job._notes),
        "restarts": {"max_restarts": job.max_restarts, "backoff_s": job.restart_backoff_s,
                     **({"spare_hosts": list(job.cluster.spare_hosts)} if job.cluster.spare_hosts else {}),
                     **({"min_nodes": job.cluster.min_nodes} if shrinks(job.cluster) else {})},
        "preflight_at_submit": job.cluster.scheduler != "slurm",
        "resume": plan.resume_from or resume,
        "log_dir": plan.log_dir, "run_dir": plan.run_dir,
        "batch": memview.to_dict(plan.batch) if plan.batch else None,
        "nodes": [{"rank": n.rank, "host": n.host, "argv": list(n.argv),
                   "env": dict(user_env(n)), "workdir": n.workdir} for n in plan.nodes],
        "files": [{"path": f.path, "note": f.note or None} for f in plan.files],
    }, plan.secrets, MASK)

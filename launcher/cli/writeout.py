"""`mlaunch render`: write a plan's files and per-node scripts to a local directory."""
from __future__ import annotations

import os
import posixpath

from ..record import fsmode
from ..nodeprog import checkpoints
from ..errors import UserError
from ..plan.launch_plan import LaunchPlan
from ..plan.trainers import TRAINERS


def write_rendered(plan: LaunchPlan, out: str) -> list[str]:
    """Write each rendered file under its base name and node<k>.sh per node; return the paths.

    Secrets stay masked: these files are for reading and review, not for running by hand.
    """
    written = []
    try:
        if not os.path.isdir(out):   # a directory of the user's keeps its mode
            fsmode.private_dir(out)
        for f in plan.files:
            written.append(_write(os.path.join(out, posixpath.basename(f.path)), plan.mask(f.content)))
            if f.note:  # JSON has no comments: where each value came from goes beside the file
                written.append(_write(os.path.join(out, posixpath.basename(f.path) + ".sources.txt"),
                                      plan.mask(f.note) + "\n"))
        if plan.job.cluster.scheduler == "slurm":
            from ..plan.sbatch import request
            written.append(_write(os.path.join(out, "job.sbatch"), plan.mask(request(plan).script)))
            written.append(_write(os.path.join(out, "node.sh"), "#!/bin/sh\n" + plan.mask(plan.nodes[0].display)))
            return written
        for node in plan.nodes:
            written.append(_write(os.path.join(out, f"node{node.rank}.sh"), "#!/bin/sh\n" + plan.mask(node.display)))
    except OSError as e:
        raise UserError(f"--out {out}: cannot write {e.filename or out}: {e.strerror}; "
                        "give a directory you can write") from None
    return written


def _write(path: str, text: str) -> str:
    return fsmode.write_private(path, text)


def render_start(job, resume: str | None, overwrite: bool) -> tuple[str | None, bool]:
    """(resume_from, overwrite) for `render` as submit would pick them, looking only at this
    machine: --resume PATH is checked here if PATH exists here; --resume/--resume=auto scan
    output_dir when it is on this machine (shared storage), else ask for a PATH."""
    if resume and overwrite:
        raise UserError("--resume and --overwrite contradict each other; pick one")
    if not resume:
        return None, overwrite
    if resume not in ("latest", "auto"):
        if os.path.isdir(resume):
            _check_here(job, resume)
        return resume, False
    if not os.path.isdir(job.output_dir or ""):
        raise UserError(f"render --resume looks only at this machine, and output_dir {job.output_dir} "
                        "is not here; give --resume PATH to render a given checkpoint")
    found = checkpoints.find_latest_complete(job.output_dir, **_layout(job))
    if found.latest:
        return found.latest, False
    if resume == "auto":   # submit starts fresh, and must not let the trainer pick a half one
        return None, found.found_any
    raise UserError(f"no complete checkpoint in {job.output_dir} to resume from; start fresh "
                    "with --resume=auto or --overwrite")


def _check_here(job, path: str) -> None:
    named = checkpoints.check_explicit(path, **_layout(job))
    if not named.latest:
        raise UserError(f"--resume {path}: {named.skipped[0].reason}")


def _layout(job) -> dict:
    """discovery_args as keyword arguments of the checkpoints functions."""
    args = TRAINERS[job.trainer].discovery_args(job)
    dp = int(args[args.index("--dp-size") + 1]) if "--dp-size" in args else None
    return {"deepspeed": "--deepspeed" in args, "dp_size": dp, "megatron": "--megatron" in args}

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
    Nothing is written through a link another user planted (in DIR or as DIR), nor into a
    file of another user's: every name is checked before the first is written
    (record/fsmode.py; one line, exit 2).
    """
    try:
        texts = _rendered(plan)
        if os.path.isdir(out):   # a directory of the user's keeps its mode
            fsmode.check_links(out)
        else:
            fsmode.private_dir(out)
        paths = [os.path.join(out, name) for name in texts]
        mark = os.path.join(out, MARK)
        for path in (mark, *paths):   # every name refused or cleared before the first write
            fsmode.check_writable(path)
        _refuse_others(out, paths)
        fsmode.write_private(mark, "files written by `mlaunch render`\n")
        return [fsmode.write_private(path, text) for path, text in zip(paths, texts.values())]
    except OSError as e:
        raise UserError(f"--out {out}: cannot write {e.filename or out}: {e.strerror}; "
                        "give a directory you can write") from None


MARK = ".mlaunch-render"   # in a directory render wrote: rendering into it again replaces its files


def _refuse_others(out: str, paths: list[str]) -> None:
    """A file render would replace in a directory it did not write: refused (it is the user's)."""
    there = [p for p in paths if os.path.lexists(p)]
    if there and not os.path.lexists(os.path.join(out, MARK)):
        more = f" and {len(there) - 1} more" if len(there) > 1 else ""
        raise UserError(f"--out {out}: holds {os.path.basename(there[0])}{more}, which render did "
                        "not write; give a new or empty directory (render replaces only its own "
                        "files)")


def _rendered(plan: LaunchPlan) -> dict[str, str]:
    """{base name: masked text} of every file `render` writes, in order."""
    texts = {}
    for f in plan.files:
        texts[posixpath.basename(f.path)] = plan.mask(f.content)
        if f.note:  # JSON has no comments: where each value came from goes beside the file
            texts[posixpath.basename(f.path) + ".sources.txt"] = plan.mask(f.note) + "\n"
    from ..backends import backend_of
    return {**texts, **backend_of(plan.job).scripts(plan)}


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
                    "with `mlaunch render JOB --resume=auto` (fresh when none is found) or "
                    "`--overwrite`")


def _check_here(job, path: str) -> None:
    named = checkpoints.check_explicit(path, **_layout(job))
    if not named.latest:
        raise UserError(f"--resume {path}: {named.skipped[0].reason}")


def _layout(job) -> dict:
    """discovery_args as keyword arguments of the checkpoints functions."""
    args = TRAINERS[job.trainer].discovery_args(job)
    dp = int(args[args.index("--dp-size") + 1]) if "--dp-size" in args else None
    return {"deepspeed": "--deepspeed" in args, "dp_size": dp, "megatron": "--megatron" in args}

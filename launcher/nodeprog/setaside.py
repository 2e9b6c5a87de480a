"""Before an attempt starts, move the checkpoint folders it may save into out of its way.
Standard library only: the launcher runs this file's source where output_dir lives (node 0, or
the login node under a scheduler; every node without a shared disk) as
`python3 - OUTPUT_DIR TAG [--resume CHECKPOINT] [--also FOLDER]`, and it
prints one JSON object: {"moved": [names], "to": folder}, with "error" (why) and "path" (the
folder not moved) when a move failed, or "unreadable" (the folder) when one could not be listed. Only output_dir's own top level: where LLaMA-Factory and
ms-swift with `add_version: false` save (ms-swift otherwise saves each attempt in a new
v<M>-<time> folder, and the launcher does not call this).

Why: a trainer saves checkpoint-N into an existing checkpoint-N folder file by file. A save of a
larger world cut part-way (or an older run's checkpoint, after --overwrite) leaves that world's
higher ranks' optimizer shards there, and a smaller world's later save of the same step does not
replace them: the folder then reads as the larger world's, and a restart converts or loads a mix
of two trainings' shards. So every `checkpoint-N` the attempt may write (N above the step it
resumes; every one at a fresh start) is renamed, whole, into
OUTPUT_DIR/mlaunch-set-aside/TAG/. Nothing is deleted; the name keeps them out of the trainers'
own scans (HF Trainer's `checkpoint-*` rotation, LLaMA-Factory's last-checkpoint look) and of
mlaunch's (launcher/nodeprog/checkpoints.py).
"""
from __future__ import annotations

import json
import os
import re
import stat
import sys

from .ckpt_checks import load_json

ASIDE = "mlaunch-set-aside"
CKPT_RE = re.compile(r"^checkpoint-(\d+)$")


def set_aside(output_dir: str, tag: str, after: int | None = None, keep: str | None = None,
              also: tuple[str, ...] = ()) -> dict:
    """Rename each checkpoint-N of output_dir (N > after; all when after is None) into
    output_dir/ASIDE/tag/, never the folder keep (the resumed checkpoint, by its real path);
    the same for each folder of `also` in output_dir (bare nodes' copies of other nodes' parts,
    into ASIDE/tag/<that folder>/). What moved, and where a move failed, why."""
    top = os.path.join(output_dir, ASIDE, tag)
    kept = os.path.realpath(keep) if keep else None
    moved: list[str] = []
    for sub in ("", *also):
        base = os.path.join(output_dir, sub) if sub else output_dir
        try:
            names = _numbered(base, after)
        except OSError as e:   # unreadable: said as one line by the launcher, nothing moved here
            return {"moved": moved, "to": top if moved else None, "error": e.strerror or str(e),
                    "unreadable": base}
        for name in names:
            src = os.path.join(base, name)
            if os.path.realpath(src) == kept:
                continue
            why = _move(output_dir, src, os.path.join(top, sub) if sub else top)
            if why:
                return {"moved": moved, "to": top if moved else None, "error": why, "path": src}
            moved.append(os.path.join(sub, name) if sub else name)
    return {"moved": moved, "to": top if moved else None}


def _numbered(base: str, after: int | None) -> list[str]:
    """base's checkpoint-N names with N > after (all when None), in step order."""
    try:
        names = os.listdir(base)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = sorted((int(n.split("-", 1)[1]), n) for n in names if CKPT_RE.match(n))
    return [n for step, n in found if after is None or step > after]


def _move(output_dir: str, src: str, dest: str) -> str | None:
    """src renamed into dest (made below output_dir, no link followed); why not, or None."""
    if not _made(output_dir, dest):   # a link planted on the way: never followed out
        return f"{dest} leads out of {output_dir} or is not this user's own folder"
    target = os.path.join(dest, os.path.basename(src))
    if os.path.lexists(target):   # never over what an earlier set-aside kept
        # gone from output_dir: the same set-aside from another login of this disk moved it
        return None if not os.path.lexists(src) else f"{target} already exists"
    try:
        os.rename(src, target)
    except FileNotFoundError as e:   # moved meanwhile, as above
        return None if os.path.lexists(target) else e.strerror or str(e)
    except OSError as e:
        return e.strerror or str(e)
    return None


def _made(output_dir: str, dest: str) -> bool:
    """Make dest's folders below output_dir one by one; False where one is a link (made by
    nothing of ours: it could lead anywhere), not a folder, or owned by another user than this
    one or output_dir's owner (who could then read or change what is moved there). The latter
    counts as one's own: on root-squashed NFS what this user makes belongs to `nobody`, as
    output_dir does, and its owner can rename anything in it already."""
    owners = {os.getuid(), os.stat(output_dir).st_uid}
    path = output_dir
    for part in os.path.relpath(dest, output_dir).split(os.sep):
        path = os.path.join(path, part)
        if not os.path.lexists(path) and _mkdir(path):
            continue
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in owners:
            return False
    return True


def _mkdir(path: str) -> bool:
    """mkdir; True when this call made it (an existing one is looked at by the caller)."""
    try:
        os.mkdir(path)
        return True
    except FileExistsError:
        return False


def resumed_step(checkpoint: str) -> int | None:
    """The step a checkpoint resumes at: the larger of its trainer_state.json's global_step and
    the number in its name (a link named checkpoint-300 to checkpoint-100 clears above 300:
    never a folder the trainer may still need); None when neither says."""
    steps = []
    try:
        step = load_json(os.path.join(checkpoint, "trainer_state.json")).get("global_step")
        if isinstance(step, int) and not isinstance(step, bool):
            steps.append(step)
    except (OSError, ValueError, AttributeError):
        pass
    m = CKPT_RE.match(os.path.basename(os.path.normpath(checkpoint)))
    steps += [int(m.group(1))] if m else []
    return max(steps) if steps else None


def main(argv: list[str] | None = None) -> int:
    """CLI for remote use: OUTPUT_DIR TAG [--resume CHECKPOINT] [--also FOLDER]; prints one
    JSON object."""
    args = sys.argv[1:] if argv is None else argv
    output_dir, tag = args[0], args[1]
    resume = args[args.index("--resume") + 1] if "--resume" in args else None
    also = (args[args.index("--also") + 1],) if "--also" in args else ()
    after = resumed_step(resume) if resume is not None else None
    if resume is not None and after is None:   # no step known: nothing is moved
        print(json.dumps({"moved": [], "to": None, "unknown_step": resume, "after": None}))
        return 0
    print(json.dumps({**set_aside(output_dir, tag, after, keep=resume, also=also), "after": after}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Before an attempt starts, move the checkpoint folders it may save into out of its way.
Standard library only: the launcher runs this file's source where output_dir lives (node 0; on
bare nodes, every node) as `python3 - OUTPUT_DIR TAG [--after STEP] [--within DIR]`, and it
prints one JSON object: {"moved": [names], "to": folder} or {"error": why}.

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
import sys

ASIDE = "mlaunch-set-aside"
CKPT_RE = re.compile(r"^checkpoint-(\d+)$")


def set_aside(output_dir: str, tag: str, after: int | None = None, within: str | None = None) -> dict:
    """Rename each checkpoint-N (N > after; all when after is None) of `within` (output_dir, or a
    folder in it such as ms-swift's v<M>-<time>) into output_dir/ASIDE/tag/; what moved."""
    base = within or output_dir
    if not _inside(base, output_dir):
        return {"moved": [], "to": None}
    try:
        names = sorted(os.listdir(base), key=lambda n: (len(n), n))
    except FileNotFoundError:
        return {"moved": [], "to": None}
    dest = os.path.normpath(os.path.join(output_dir, ASIDE, tag, os.path.relpath(base, output_dir)))
    moved = []
    for name in names:
        m = CKPT_RE.match(name)
        if not m or (after is not None and int(m.group(1)) <= after):
            continue
        if not _made(output_dir, dest):   # a link planted on the way: never followed out
            return {"error": f"{dest} leads out of {output_dir}", "moved": moved, "to": None}
        target = os.path.join(dest, name)
        if os.path.lexists(target):   # never over what an earlier set-aside kept
            return {"error": f"{target} already exists", "moved": moved, "to": dest}
        try:
            os.rename(os.path.join(base, name), target)
        except OSError as e:
            return {"error": f"{os.path.join(base, name)}: {e.strerror}", "moved": moved, "to": dest}
        moved.append(os.path.relpath(os.path.join(base, name), output_dir))
    return {"moved": moved, "to": dest if moved else None}


def _made(output_dir: str, dest: str) -> bool:
    """Make dest's folders below output_dir one by one; False where one is a link (made by
    nothing of ours: it could lead anywhere) or not a folder."""
    path = output_dir
    for part in os.path.relpath(dest, output_dir).split(os.sep):
        path = os.path.join(path, part)
        if not os.path.lexists(path) and _mkdir(path):
            continue
        if os.path.islink(path) or not os.path.isdir(path):
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
    """The step a checkpoint resumes at: its trainer_state.json's global_step, else the number
    in its name; None when neither says."""
    try:
        with open(os.path.join(checkpoint, "trainer_state.json"), encoding="utf-8") as fh:
            step = json.load(fh).get("global_step")
        if isinstance(step, int) and not isinstance(step, bool):
            return step
    except (OSError, ValueError, AttributeError):
        pass
    m = CKPT_RE.match(os.path.basename(os.path.normpath(checkpoint)))
    return int(m.group(1)) if m else None


def _inside(path: str, output_dir: str) -> bool:
    """Whether path is output_dir or a folder in it, links resolved (never a folder elsewhere)."""
    real, top = os.path.realpath(path), os.path.realpath(output_dir)
    return real == top or real.startswith(top.rstrip("/") + "/")


def plan_for(output_dir: str, resume: str | None) -> tuple[int | None, str | None]:
    """(after, within) for an attempt that resumes `resume` (None: a fresh start): the folder
    that holds the resumed checkpoint when it is in output_dir, else output_dir itself."""
    if resume is None:
        return None, None
    step = resumed_step(resume)
    parent = os.path.dirname(os.path.normpath(resume))
    return step, (parent if _inside(parent, output_dir) else None)


def main(argv: list[str] | None = None) -> int:
    """CLI for remote use: OUTPUT_DIR TAG [--resume CHECKPOINT]; prints one JSON object."""
    args = sys.argv[1:] if argv is None else argv
    output_dir, tag = args[0], args[1]
    resume = args[args.index("--resume") + 1] if "--resume" in args else None
    after, within = plan_for(output_dir, resume)
    if resume is not None and after is None:   # no step known: nothing is moved
        print(json.dumps({"moved": [], "to": None, "unknown_step": resume}))
        return 0
    print(json.dumps(set_aside(output_dir, tag, after, within)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

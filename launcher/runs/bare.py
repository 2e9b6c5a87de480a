"""The attempt loop's side of checkpoints on hosts that share no disk (issue 54): the copies
made while an attempt runs, and the checkpoint a restart resumes from, found across copies
(launcher/transport/replicas.py does the I/O)."""
from __future__ import annotations

import contextlib
import posixpath
from typing import Iterator

from ..errors import UserError
from ..logs.stream import Printer
from ..nodeprog.setaside import ASIDE, CKPT_RE


def stages(plan) -> bool:
    """Whether the spec asks for staging (staging:, tokenize_once)."""
    return bool(getattr(plan.job, "staging", None) or getattr(plan.job, "tokenize_once", None))


def stage(backend, plan, executor, printer: Printer) -> None:
    """The backend's staging (staging:, tokenize_once) of plan's nodes, where the spec asks
    for any: before preflight, and again before a restart (a spare has nothing yet)."""
    if stages(plan):
        backend.stage_inputs(plan, executor, printer)


def leftovers(plan, executor, printer: Printer) -> frozenset[str]:
    """At a fresh start (no checkpoint resumed), the checkpoint numbers the nodes already hold:
    an earlier run's (--overwrite), which no restart of this run takes for its own, and which
    the copies never copy or remove. Empty without `checkpoints:`."""
    if not getattr(plan.job, "checkpoints", None) or not plan.job.output_dir:
        return frozenset()
    from ..transport.replicas import leftovers as held
    stale = held(plan, executor)
    if stale:
        names = ", ".join(f"checkpoint-{n}" for n in sorted(stale, key=int))
        printer.say(f"checkpoints: {names} on the nodes are an earlier run's: this run starts fresh, "
                    "and never resumes, copies or removes them (a save of this run under one of "
                    "those numbers is not resumed either, until a restart moves them into "
                    "output_dir/mlaunch-set-aside/)")
    return stale


@contextlib.contextmanager
def copies(plan, executor, printer: Printer, events, saved_world: dict[str, int],
           stale: frozenset[str] = frozenset()) -> Iterator[None]:
    """While the block runs (an attempt), each node's part of every complete checkpoint is
    copied to checkpoints.replicas other nodes; nothing without `checkpoints:`."""
    if not getattr(plan.job, "checkpoints", None) or not plan.job.output_dir:
        yield
        return
    from ..transport.replicas import Replicator
    rep = Replicator(plan, executor, printer.say, events, saved_world, stale).start()
    try:
        yield
    finally:
        rep.stop()


def clear_way(plan, executor, printer: Printer, events, resume_from: str | None,
              saved_world: dict[str, int]) -> frozenset[str]:
    """Before a restart on nodes that share no disk: on every node, the checkpoint folders
    the attempt may save again (above the step it resumes) and the copies of their parts moved
    into output_dir/mlaunch-set-aside/ (launcher/nodeprog/setaside.py). A save cut part-way
    leaves its ranks' files on each node's own disk; the smaller world's save of that step would
    land beside them, and putting the checkpoint together would merge both. Their numbers are
    forgotten by the copies (saved_world: every number above the resumed step, moved or not).
    At a fresh start an earlier run's numbers are never resumed at all (leftovers). A failed
    move ends the run before the attempt starts. The numbers moved (no node holds them now)."""
    if not getattr(plan.job, "checkpoints", None) or not plan.job.output_dir or plan.attempt == 0:
        return frozenset()
    from ..transport.replicas import set_aside
    tag = f"{plan.run_id}-attempt{plan.attempt}"
    got = set_aside(plan, executor, tag, resume_from)
    moved = {h: v["moved"] for h, v in got.items() if v.get("moved")}
    numbers = frozenset(name.rsplit("checkpoint-", 1)[1] for names in moved.values() for name in names)
    # the step the nodes cleared above (the resumed checkpoint's trainer_state.json or name)
    steps = [v["after"] for v in got.values() if isinstance(v.get("after"), int)]
    step = max(steps) if steps else _step_of(resume_from)
    if resume_from is None or step is not None:   # no step known: nothing moved, nothing forgotten
        for num in [k for k in saved_world if step is None or int(k) > step]:
            del saved_world[num]   # a save of it now is this attempt's, at its world
    if moved:
        where = "; ".join(f"{h}: {', '.join(names)}" for h, names in moved.items())
        to = posixpath.join(plan.job.output_dir, ASIDE, tag)   # the same path on every node
        printer.say(f"checkpoints: moved to {to} on each node before attempt {plan.attempt}, which saves "
                    f"those steps again ({where}); nothing was deleted")
        events.emit("checkpoints_set_aside", moved=sorted({n for ns in moved.values() for n in ns}), to=to,
                    hosts=sorted(moved))
    bad = [(f"on {h}: could not move {v['path']} out of the way of attempt {plan.attempt}'s saves: "
            f"{v['error']}; move it out of {plan.job.output_dir} there yourself (nothing was deleted), "
            "then submit again") if v.get("path") else
           (f"on {h}: could not look for checkpoint folders that attempt {plan.attempt} saves again"
            f"{' in ' + v['unreadable'] if v.get('unreadable') else ''} ({v['error']}); the run ends "
            "before it (nothing was moved there)")
           for h, v in got.items() if v.get("error")]
    if bad:
        raise UserError(bad)
    return numbers


def _step_of(checkpoint: str | None) -> int | None:
    """The step in a checkpoint-N path's name (the assembled one a bare restart resumes)."""
    m = CKPT_RE.match(posixpath.basename((checkpoint or "").rstrip("/")))
    return int(m.group(1)) if m else None


def newest(plan, executor, printer: Printer, master, saved_world: dict[str, int],
           stale: frozenset[str] = frozenset()):
    """Before a restart: the newest checkpoint complete across the copies the attempt's nodes
    hold (none numbered in stale), put together and on every node; its Discovery on node 0
    (None: no checkpoint)."""
    from ..transport.replicas import assemble
    ckpt = assemble(plan, executor, printer.say, saved_world, stale)
    return master.discover(checkpoint=ckpt) if ckpt else None


def spread(plan, executor, printer: Printer, ckpt: str) -> None:
    """node 0's checkpoint (converted to the universal form there) staged to every node."""
    from ..transport.replicas import spread as stage_it
    stage_it(plan, executor, printer.say, ckpt)

"""The attempt loop's side of checkpoints on hosts that share no disk (issue 54): the copies
made while an attempt runs, and the checkpoint a restart resumes from, found across copies
(launcher/transport/replicas.py does the I/O)."""
from __future__ import annotations

import contextlib
from typing import Iterator

from ..logs.stream import Printer


def stage(backend, plan, executor, printer: Printer) -> None:
    """The backend's staging (staging:, tokenize_once) of plan's nodes, where the spec asks
    for any: before preflight, and again before a restart (a spare has nothing yet)."""
    if getattr(plan.job, "staging", None) or getattr(plan.job, "tokenize_once", None):
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
                    "those numbers is not resumed either)")
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

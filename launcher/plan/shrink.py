"""The batch arithmetic of elastic shrink (issue 29): the same global batch on fewer nodes.

A restart on fewer nodes keeps the global batch by recomputing the accumulation:
grad_accum = global / (new world × per_device). per_device stays the memory plan's choice
(never raised: it was the largest that fits), so a world that does not divide the global
batch is refused. Pure: no I/O, no spec loading.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Size:
    """One node count the job may run at: its world and its accumulation (None: refused)."""

    nodes: int
    world: int
    grad_accum: int | None


def regrad(global_batch: int, world: int, per_device: int) -> int | None:
    """The accumulation that keeps global_batch at this world, or None when none does."""
    per_step = world * per_device
    if per_step <= 0 or global_batch % per_step:
        return None
    return global_batch // per_step


def sizes(procs: int, nodes: int, min_nodes: int, global_batch: int, per_device: int) -> list[Size]:
    """Every node count from `nodes` down to `min_nodes` (each node runs `procs` processes)."""
    return [Size(n, n * procs, regrad(global_batch, n * procs, per_device))
            for n in range(nodes, min_nodes - 1, -1)]


def refusal(size: Size, global_batch: int, per_device: int, allowed: list[Size]) -> str:
    """The one line of a shrink to `size` that does not divide the global batch."""
    fits = [str(s.nodes) for s in allowed if s.grad_accum is not None]
    hint = (f"node counts that keep it: {', '.join(fits)}" if fits else
            "no node count from cluster.min_nodes up keeps it")
    return (f"cannot shrink to {size.nodes} nodes: the global batch {global_batch} is not a "
            f"multiple of world {size.world} × per_device {per_device} = "
            f"{size.world * per_device} (per_device is never raised); {hint}; give a "
            "batch.global that they divide, or a cluster.min_nodes that avoids it; the run ends")

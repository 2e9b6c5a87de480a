"""The staging plan (issue 54): which node gets each staged item from whom, in rounds. Pure:
no I/O; launcher/transport/staging.py runs it.

Fan-out: in each round every holder of an item (the launcher's machine, or the node that had
it, and every node that received it in an earlier round) feeds one node that lacks it, so the
holders double each round and n nodes take about log2(n+1) rounds: the source's uplink carries
one copy per round, not one per node.
"""
from __future__ import annotations

from dataclasses import dataclass

LAUNCHER = ""   # the launcher's machine as a holder


@dataclass(frozen=True)
class Copy:
    """One copy of an item: from a holder (LAUNCHER, or a node's login) to a node's login."""

    src: str
    dst: str


def rounds(holders: list[str], lacking: list[str]) -> list[list[Copy]]:
    """The copies of each round until every node of lacking has the item; holders first feed
    in their order (the source first)."""
    have, left, out = list(holders), list(lacking), []
    while left:
        now = [Copy(h, left[i]) for i, h in enumerate(have[:len(left)])]
        left = left[len(now):]
        have += [c.dst for c in now]
        out.append(now)
    return out


def needed_bytes(src_files: dict, node_files: dict) -> int:
    """Bytes a node must receive: the source's files its stored manifest lacks or holds with
    another size or hash (what it has is hard-linked into the new copy)."""
    return sum(v[0] for rel, v in src_files.items() if list(node_files.get(rel, [])[:2]) != list(v[:2]))


def size_text(n: float) -> str:
    """n bytes as a short text (1.2 GB, 340 MB, 12 kB, 5 B)."""
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{int(n)} B"

"""Python stack dumps of every rank (py-spy): splitting a node's dump and grouping ranks.

The node side prints, for every rank process of the run, a header line
``MLAUNCH-STACK pid=<pid> node=<node rank> rank=<rank> local=<local_rank> rc=<exit>`` followed by
``py-spy dump`` output (templates/stacks.sh.j2). Grouping by the innermost frame of each
rank's main thread turns 8 dumps into one line such as
"rank 5 in all_reduce (distributed_c10d.py); ranks 0-4,6,7 in save_checkpoint (trainer.py)".
"""
from __future__ import annotations

import re
from dataclasses import dataclass

HEADER = re.compile(r"^MLAUNCH-STACK pid=(\d+) node=(-?\d+) rank=(-?\d+) local=(-?\d+) rc=(\d+)$")
THREAD = re.compile(r'^Thread \S+ \((\w+)\): "([^"]*)"')
FRAME = re.compile(r"^\s+(\S.*?) \(([^():]+)(?::(\d+))?\)\s*$")
DENIED = re.compile(r"Permission denied|Operation not permitted|ptrace", re.I)


@dataclass(frozen=True)
class RankStack:
    """One rank's dump."""

    pid: int
    node: int
    rank: int
    local_rank: int
    text: str
    ok: bool

    @property
    def top(self) -> str:
        """The innermost Python frame of the main thread, as 'function (file)'."""
        frames = main_thread_frames(self.text)
        if not frames:
            return "no stack (py-spy failed)" if not self.ok else "no Python frame"
        # With --native the innermost frames are C (libc, libtorch): name the Python one.
        func, path = next((f for f in frames if f[1].endswith(".py")), frames[0])
        return f"{func} ({path.rsplit('/', 1)[-1]})"


def split_dump(output: str) -> list[RankStack]:
    """The per-rank parts of one node's dump output."""
    out: list[RankStack] = []
    cur: tuple[int, int, int, int, int] | None = None
    buf: list[str] = []

    def close() -> None:
        if cur is not None:
            pid, node, rank, local, rc = cur
            out.append(RankStack(pid, node, rank, local, "\n".join(buf).strip() + "\n", rc == 0))

    for line in output.splitlines():
        m = HEADER.match(line)
        if m:
            close()
            cur, buf = tuple(int(g) for g in m.groups()), []  # type: ignore[assignment]
        elif cur is not None:
            buf.append(line)
    close()
    return out


def main_thread_frames(text: str) -> list[tuple[str, str]]:
    """(function, file) of the main thread's frames, innermost first; else the first thread's."""
    threads: list[tuple[str, list[tuple[str, str]]]] = []
    for line in text.splitlines():
        t = THREAD.match(line)
        if t:
            threads.append((t.group(2), []))
            continue
        f = FRAME.match(line)
        if f and threads:
            threads[-1][1].append((f.group(1), f.group(2)))
    for name, frames in threads:
        if name == "MainThread" and frames:
            return frames
    return next((frames for _, frames in threads if frames), [])


def _ranges(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(parts)


def summary(stacks: list[RankStack]) -> str:
    """One line: the ranks grouped by where they are, smallest group first."""
    groups: dict[str, list[int]] = {}
    for s in stacks:
        groups.setdefault(s.top, []).append(s.rank)
    if not groups:
        return "no rank process found to dump"
    parts = sorted(groups.items(), key=lambda kv: (len(kv[1]), min(kv[1])))
    return "; ".join(f"{'rank' if len(r) == 1 else 'ranks'} {_ranges(r)} in {top}"
                     for top, r in parts)


def denied(stacks: list[RankStack]) -> bool:
    """Whether py-spy was refused ptrace rights on some rank."""
    return any(not s.ok and DENIED.search(s.text) for s in stacks)

"""Python stack dumps of every rank (py-spy): splitting a node's dump and grouping ranks.

The node side prints, for every rank process of the run, a header line
``MLAUNCH-STACK pid=<pid> node=<node rank> rank=<rank> local=<local_rank> rc=<exit> mode=<m>
state=<s>`` followed by each ``py-spy dump`` attempt behind an ``MLAUNCH-TRY mode=<m> rc=<exit>``
line (templates/stacks.sh.j2): --native, plain, then --nonblocking, which is the one that reads
a stopped or uninterruptible process. Grouping by the innermost frame of each
rank's main thread turns 8 dumps into one line such as
"rank 5 in all_reduce (distributed_c10d.py); ranks 0-4,6,7 in save_checkpoint (trainer.py)".
"""
from __future__ import annotations

import re
from dataclasses import dataclass

HEADER = re.compile(r"^MLAUNCH-STACK pid=(\d+) node=(-?\d+) rank=(-?\d+) local=(-?\d+) rc=(\d+)"
                    r"(?: mode=(\w+))?(?: state=(\S*))?$")
TRY = re.compile(r"^MLAUNCH-TRY mode=(\w+) rc=(\d+)$")
THREAD = re.compile(r'^Thread \S+ \((\w+)\): "([^"]*)"')
FRAME = re.compile(r"^\s+(\S.*?) \(([^():]+)(?::(\d+))?\)\s*$")
# The causes of a failed dump, read from py-spy's own errors, most specific first. A stopped
# process fails the blocking dump with "unexpected waitpid result PtraceEvent(... SIGSTOP ...)":
# that names ptrace without being a refusal of it.
CAUSES = (
    ("missing", re.compile(r"failed to run command|command not found")),
    ("stopped", re.compile(r"PtraceEvent\(.*SIGSTOP|Failed to suspend process")),
    ("gone", re.compile(r"No such process|Check that the process is running|No such file or directory")),
    ("denied", re.compile(r"Permission denied|Operation not permitted|ptrace_scope|EPERM", re.I)),
    ("not python", re.compile(r"Failed to find python version")),
)
CAUSE_TEXT = {
    "stopped": "the process is stopped (SIGSTOP or a debugger) and the non-blocking read failed too",
    "gone": "the process exited before py-spy read it",
    "denied": "py-spy was refused ptrace",
    "not python": "py-spy found no Python interpreter in it",
    "missing": "py-spy is not installed there",
    "timeout": "py-spy timed out on it (a process in uninterruptible I/O?)",
}
STATES = {"T": "stopped", "t": "stopped by a debugger", "D": "in uninterruptible I/O", "Z": "a zombie"}


@dataclass(frozen=True)
class RankStack:
    """One rank's dump."""

    pid: int
    node: int
    rank: int
    local_rank: int
    text: str
    ok: bool
    mode: str = ""       # the py-spy attempt whose output counts: native, plain, nonblocking
    state: str = ""      # the process state from /proc/<pid>/status: R, S, D, T, ...

    @property
    def top(self) -> str:
        """The innermost Python frame of the main thread, as 'function (file)', and the
        process state when it is one a hang report must point at (stopped, in D state)."""
        frames = main_thread_frames(last_attempt(self.text))
        if not frames:
            top = f"no stack ({self.cause()})" if not self.ok else "no Python frame"
        else:
            # With --native the innermost frames are C (libc, libtorch): name the Python one.
            func, path = next((f for f in frames if f[1].endswith(".py")), frames[0])
            top = f"{func} ({path.rsplit('/', 1)[-1]})"
        return f"{top}, {STATES[self.state]}" if self.state in STATES else top

    def cause(self) -> str:
        """Why no dump came, in words, from py-spy's errors and the process state."""
        return CAUSE_TEXT.get(self.cause_key(), "py-spy failed") if not self.ok else ""

    def cause_key(self) -> str:
        """The kind of failure: a key of CAUSE_TEXT, or '' when the dump worked or none fits."""
        if self.ok:
            return ""
        if self.state in ("T", "t"):
            return "stopped"
        for key, pattern in CAUSES:
            if pattern.search(self.text):
                return key
        return "timeout" if re.search(r"^MLAUNCH-TRY mode=\w+ rc=124$", self.text, re.M) else ""

    @property
    def python(self) -> bool:
        """Whether py-spy recognised a Python interpreter in the process."""
        return bool(re.search(r"^Python v\d", self.text, re.M))


NO_DUMP = "mlaunch: no stack dump on this host"   # templates/stacks.sh.j2's line where it could not try


def refusals(outputs: list[str]) -> str:
    """What the nodes that could not try a dump said (templates/stacks.sh.j2), one each; ""."""
    said = [line.removeprefix("mlaunch: ") for out in outputs for line in out.splitlines()
            if line.startswith(NO_DUMP)]
    return "; ".join(f"{n} node{'s' if n > 1 else ''}: {w}" for w, n in
                     sorted({w: said.count(w) for w in said}.items()))


def split_dump(output: str) -> list[RankStack]:
    """The per-rank parts of one node's dump output."""
    out: list[RankStack] = []
    cur: re.Match | None = None
    buf: list[str] = []

    def close() -> None:
        if cur is not None:
            pid, node, rank, local, rc = (int(g) for g in cur.groups()[:5])
            out.append(RankStack(pid, node, rank, local, "\n".join(buf).strip() + "\n", rc == 0,
                                 cur.group(6) or "", (cur.group(7) or "").strip("?")))

    for line in output.splitlines():
        m = HEADER.match(line)
        if m:
            close()
            cur, buf = m, []
        elif cur is not None:
            buf.append(line)
    close()
    return once_per_rank(out)


def once_per_rank(found: list[RankStack]) -> list[RankStack]:
    """One dump per (node, rank): processes that inherited a rank's environment (a helper
    under `timeout` beside an in-process rank, a worker) must not list the rank again. The
    kept one is the dump that worked, else the process py-spy saw as Python, else the first."""
    best: dict[tuple[int, int], RankStack] = {}
    for s in found:
        key = (s.node, s.rank)
        old = best.get(key)
        if old is None or (s.ok, s.python) > (old.ok, old.python):
            best[key] = s
    return sorted(best.values(), key=lambda s: (s.node, s.rank))


def last_attempt(text: str) -> str:
    """The output of the attempt that counts (the last one); the whole text without markers."""
    parts = re.split(r"^MLAUNCH-TRY .*$", text, flags=re.M)
    return parts[-1]


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
    """Whether py-spy was refused ptrace rights on some rank (and not for another cause)."""
    return any(s.cause_key() == "denied" for s in stacks)


def advice(stacks: list[RankStack]) -> str:
    """What to do about failed dumps, for the causes a user can fix; '' when none."""
    keys = {s.cause_key() for s in stacks}
    if "denied" in keys:
        return ("py-spy was refused ptrace: run as the ranks' user with "
                "kernel.yama.ptrace_scope=0, or give py-spy CAP_SYS_PTRACE")
    if "missing" in keys or (stacks and not any(s.ok for s in stacks) and keys == {""}):
        return "py-spy failed (is it installed beside the node's python? pip install py-spy)"
    return ""

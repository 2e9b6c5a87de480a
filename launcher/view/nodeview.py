"""The live per-node view: GPU (or CPU) samples, each node's state and step, as status lines.

Samples arrive over each node's own session, on the same output as the job's lines, behind
a marker (templates/sampler.sh.j2): ``\\x1emlaunch-gpu <index>, <util %>, <used MiB>, <total MiB>``
(nvidia-smi's csv,noheader,nounits rows) or ``\\x1emlaunch-cpu <busy> <idle> <MemTotal kB>
<MemAvailable kB>`` (jiffies from /proc/stat) on a node without GPUs. No terminal, no
threads; the session (session/attempt.py) feeds it and the printer draws what it returns.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field

from ..record import fsmode

MARK = "\x1emlaunch-"
EVENT_EVERY_S = 60.0   # one gpu_sample event per node per minute in events.jsonl
LIVE_FILE = "live.json"


@dataclass(frozen=True)
class Gpu:
    index: int
    util: int            # % of the last sample period a kernel ran
    used_mib: int
    total_mib: int


@dataclass
class Cpu:
    util: float | None   # % busy since the previous sample (None for the first)
    used_mib: int
    total_mib: int


def split_text(text: str) -> tuple[str, list[str]]:
    """split() for a text of whole lines, each ending in "\n": (the job's text, the samples)."""
    if "\x1e" not in text:   # the common case: one scan, no copies
        return text, []
    kept, samples = split(text[:-1].split("\n"))
    return "".join(line + "\n" for line in kept), samples


def split(lines: list[str]) -> tuple[list[str], list[str]]:
    """(the job's lines, the sample bodies) of a batch of lines from one node.

    A sample can land inside a line the job had not finished (both share one output), so
    the marker is looked for anywhere: the text before it stays a job line.
    """
    if not any("\x1e" in line for line in lines):   # the common case: one scan, no copies
        return lines, []
    kept, samples = [], []
    for line in lines:
        head, mark, body = line.partition(MARK)
        if not mark:
            kept.append(line)
            continue
        if head:
            kept.append(head)
        samples.append(body)
    return kept, samples


def parse_gpu(text: str) -> Gpu | None:
    """One nvidia-smi row ("0, 87, 64783, 143771"); None for anything else ("[N/A]", errors)."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 4:
        return None
    try:
        index, util, used, total = (int(float(p)) for p in parts)
    except ValueError:
        return None
    return Gpu(index, util, used, total)


@dataclass
class NodeState:
    """What the view knows of one node."""

    rank: int
    host: str
    state: str = "starting"
    step: int | None = None
    total: int | None = None
    last_output: float | None = None
    gpus: dict[int, Gpu] = field(default_factory=dict)
    cpu: Cpu | None = None
    sampled: float | None = None
    samples: int = 0
    _jiffies: tuple[int, int] | None = None
    _evented: float | None = None

    def sample(self, body: str, now: float) -> None:
        self.samples += 1
        kind, _, rest = body.partition(" ")
        if kind == "gpu" and (gpu := parse_gpu(rest)) is not None:
            self.gpus[gpu.index] = gpu
            self.sampled = now
        elif kind == "cpu":
            self._cpu(rest, now)

    def _cpu(self, rest: str, now: float) -> None:
        try:
            busy, idle, total_kb, avail_kb = (int(x) for x in rest.split())
        except ValueError:
            return
        util = None
        if self._jiffies is not None:
            d_busy, d_idle = busy - self._jiffies[0], idle - self._jiffies[1]
            util = 100.0 * d_busy / (d_busy + d_idle) if d_busy + d_idle > 0 else 0.0
        self._jiffies = (busy, idle)
        self.cpu = Cpu(util, (total_kb - avail_kb) // 1024, total_kb // 1024)
        self.sampled = now

    def figures(self) -> dict:
        """The last sample as plain data (live.json, the gpu_sample event)."""
        if self.gpus:
            return {"gpus": [{"index": g.index, "util": g.util, "mem_used_mib": g.used_mib,
                              "mem_total_mib": g.total_mib} for g in sorted(self.gpus.values(),
                                                                             key=lambda g: g.index)]}
        if self.cpu is not None:
            return {"cpu": {"util": None if self.cpu.util is None else round(self.cpu.util, 1),
                            "mem_used_mib": self.cpu.used_mib, "mem_total_mib": self.cpu.total_mib}}
        return {}


class LiveView:
    """Every node's state for the status lines, live.json and the per-minute events."""

    def __init__(self, run_id: str, nodes: list[tuple[int, str]], clock=time.monotonic):
        self.run_id, self.clock = run_id, clock
        self.nodes = [NodeState(rank, host) for rank, host in nodes]
        self.job_step: int | None = None
        self.job_total: int | None = None
        self._lock = threading.Lock()

    def output(self, rank: int, samples: list[str]) -> None:
        """Sample rows that arrived from one node."""
        now = self.clock()
        with self._lock:
            for body in samples:
                self.nodes[rank].sample(body, now)

    def lines_seen(self, rank: int) -> None:
        """The node printed lines of the job's own."""
        node = self.nodes[rank]
        node.last_output = self.clock()
        if node.state == "starting":
            node.state = "running"

    def steps(self, job: tuple[int | None, int | None], per_node: dict[int, tuple]) -> None:
        """The job's last step and each node's own (from the health monitor)."""
        self.job_step, self.job_total = job
        for rank, (step, total) in per_node.items():
            if 0 <= rank < len(self.nodes):
                self.nodes[rank].step, self.nodes[rank].total = step, total

    def ended(self, rank: int, result: str) -> None:
        self.nodes[rank].state = result

    def due_events(self) -> list[dict]:
        """gpu_sample event fields of the nodes whose last event is a minute old (or none)."""
        now, out = self.clock(), []
        with self._lock:
            return self._due(now, out)

    def _due(self, now: float, out: list[dict]) -> list[dict]:
        for n in self.nodes:
            if n.sampled is None or (n._evented is not None and now - n._evented < EVENT_EVERY_S):
                continue
            n._evented = now
            out.append({"node": n.rank, "host": n.host, **n.figures()})
        return out

    def snapshot(self) -> dict:
        """What `mlaunch ps RUN` and `attach` read back: every node's last sample, with times."""
        wall, now = time.time(), self.clock()
        def ago(t):
            return None if t is None else round(now - t, 1)
        with self._lock:
            return self._snapshot(wall, ago)

    def _snapshot(self, wall: float, ago) -> dict:
        return {"run_id": self.run_id, "time": wall, "step": self.job_step, "total": self.job_total,
                "nodes": [{"node": n.rank, "host": n.host, "state": n.state, "step": n.step,
                           "total": n.total, "output_ago_s": ago(n.last_output),
                           "sample_ago_s": ago(n.sampled), "samples": n.samples, **n.figures()} for n in self.nodes]}

    def status_lines(self, width: int = 120) -> list[str]:
        return status_lines(self.snapshot(), width)


def status_lines(snap: dict, width: int = 120, age_s: float = 0.0) -> list[str]:
    """One header line and one line per node, each cut to width (a wrapped line would break
    the in-place redraw). age_s: how old the snapshot is (attach and ps read it from a file)."""
    step = _step(snap.get("step"), snap.get("total"))
    count = len(snap["nodes"])
    head = f"run {snap['run_id']}: {count} node{'s' if count != 1 else ''}" + (f", step {step}" if step else "")
    if age_s >= 5:
        head += f" (as of {age_s:.0f}s ago)"
    hosts = max((len(n["host"]) for n in snap["nodes"]), default=0)
    rows = [head] + [_node_line(n, hosts, age_s) for n in snap["nodes"]]
    return [r if len(r) < width else r[:max(width - 2, 1)] + "…" for r in rows]


def _node_line(n: dict, hosts: int, age_s: float) -> str:
    out = n.get("output_ago_s")
    parts = [f"node{n['node']:<2} {n['host']:<{hosts}}", f"{n['state']:<10}",
             f"step {_step(n.get('step'), n.get('total')) or '-':<9}",
             f"out {_age(out + age_s) if out is not None else '-':>4}"]
    if n.get("gpus"):
        parts += [f"gpu{g['index']} {g['util']:>3}% {g['mem_used_mib'] / 1024:5.1f}/"
                  f"{g['mem_total_mib'] / 1024:.0f}G" for g in n["gpus"]]
    elif n.get("cpu"):
        c = n["cpu"]
        util = "  -" if c["util"] is None else f"{c['util']:3.0f}"
        parts.append(f"cpu {util}% mem {c['mem_used_mib'] / 1024:.1f}/{c['mem_total_mib'] / 1024:.0f}G")
    return "  ".join(parts)


def _step(step, total) -> str:
    if step is None:
        return ""
    return f"{step}/{total}" if total else str(step)


def _age(s: float) -> str:
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m"


def write_snapshot(log_dir: str, snap: dict) -> None:
    """live.json in the run's log directory, replaced whole (a reader never sees half)."""
    path = os.path.join(log_dir, LIVE_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    with fsmode.open_private(tmp, "w") as f:
        json.dump(snap, f)
    os.replace(tmp, path)


def read_snapshot(log_dir: str | None) -> dict | None:
    """The run's last live.json, or None when it has none (sampling off, nothing sampled yet)."""
    if not log_dir:
        return None
    try:
        with open(os.path.join(log_dir, LIVE_FILE), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

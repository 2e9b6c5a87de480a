"""The running job's health watch: feeds the monitor, writes events.jsonl, dumps stacks.

It sits beside the session (job.py) and acts only through the executor: a hang gets every
rank's Python stack from py-spy on every host before the job is torn down.
"""
from __future__ import annotations

import os
import posixpath
import threading
from concurrent.futures import ThreadPoolExecutor

from .. import render
from . import hwcause, milestones, stacks
from ..record import fsmode, phases, runevents
from ..record.events import EventLog, utc_now
from .health import HealthConfig, Monitor, Verdict, may_matter
from ..plan.launch_plan import LaunchPlan, remote_bin

HANG_EXIT = 124       # as GNU timeout: the job made no progress in time
NAN_EXIT = 65         # EX_DATAERR: the numbers diverged
WORLD_EXIT = 78       # EX_CONFIG: a node joined a world of the wrong size
EXIT_CODES = {"hang": HANG_EXIT, "nan": NAN_EXIT, "world_size_mismatch": WORLD_EXIT}
HW_TAIL_BYTES = 64 << 20   # of each node log, read for a hardware cause after a failed attempt


def _tail_chunks(path: str, size: int, chunk: int = 1 << 22):
    """The whole lines of the last `size` bytes of the file at path, a list per 4 MiB read
    (none when it cannot be read: a node log removed meanwhile)."""
    try:
        fh = open(path, "rb")
    except OSError:
        return
    with fh:
        fh.seek(max(0, os.fstat(fh.fileno()).st_size - size))
        rest, first = b"", fh.tell() > 0
        while data := fh.read(chunk):
            data = rest + data
            cut = data.rfind(b"\n") + 1
            text, rest = data[:cut].decode("utf-8", "replace"), data[cut:]
            if first:   # the partial line the seek landed in
                text, first = text.partition("\n")[2], False
            yield text.splitlines()
        if rest:
            yield [rest.decode("utf-8", "replace")]


def world_size(plan: LaunchPlan) -> int:
    """Processes in the plan: the sum of each node's --nproc-per-node (1 without torchrun)."""
    total = 0
    for node in plan.nodes:
        argv = list(node.argv)
        total += int(argv[argv.index("--nproc-per-node") + 1]) if "--nproc-per-node" in argv else 1
    return total


def config_of(plan: LaunchPlan) -> HealthConfig:
    h = plan.job.health
    return HealthConfig(hang_after_s=h.hang_after_s, startup_after_s=h.startup_after_s,
                        nan_patience=h.nan_patience, zero_loss_patience=h.zero_loss_patience,
                        check_world_size=h.world_size_check, log_every=h.log_every)


class Watch:
    """One attempt's health watch and event log."""

    def __init__(self, plan: LaunchPlan, executor, say, clock):
        """executor: the attempt's transport (launcher/transport/base.py), for stack dumps."""
        self.plan, self.executor, self.say = plan, executor, say
        self.enabled = plan.job.health.enabled
        self.monitor = Monitor(config_of(plan), world_size(plan), clock)
        base_id = plan.run_id
        self.events = EventLog(os.path.join(plan.log_dir, "events.jsonl"), base_id, plan.attempt)
        self.verdict: Verdict | None = None   # the first verdict that stopped the run
        self.hardware: dict[int, tuple[str, bool]] = {}   # node -> its first hwcause line
        self._lock = threading.Lock()
        self._logged = 0
        # read as the report reads it: a torn line (a full disk) must not end the run
        reached = phases.reached_before(runevents.jsonl(self.events.path), plan.attempt) if plan.attempt else None
        self.milestones = milestones.Milestones(lambda **f: self.events.emit(phases.PHASE, **f), reached)

    def phase(self, name: str, **fields) -> None:
        """The attempt's next phase begins (launcher/record/phases.py)."""
        self.events.emit(phases.PHASE, phase=name, **fields)

    def lines(self, rank: int, host: str, lines: list[str]) -> Verdict | None:
        """Feed one node's lines; the stopping verdict, if these lines caused one."""
        with self._lock:
            self.milestones.lines(lines)
            verdicts = self.monitor.lines(rank, host, lines)
            stop = self._take(verdicts)
            if not self.milestones.caught:
                self.milestones.step(self.monitor.last_step, first=False)
            return stop

    def hardware_in(self, rank: int, host: str, lines: list[str]) -> None:
        """Keep the node's first hardware-looking line (hwcause.py), or a DEVICE one after a
        LINK one: its own GPU failing outweighs the link errors its ranks may print first."""
        known = self.hardware.get(rank)
        if known is not None and known[1]:
            return
        found = hwcause.first_cause(lines, device_only=known is not None)
        if found:
            found = (self.plan.mask(found[0]), found[1])   # it is logged, printed, recorded
            self.hardware[rank] = found
            self.events.emit("hardware_error", node=rank, host=host, cause=found[0])

    def hardware_in_logs(self) -> None:
        """After an attempt that failed: each node's hardware-looking cause, from the last
        HW_TAIL_BYTES of its node log. Not scanned as the output streams: the hardware words
        cost a flood more than every other step together (bench/results/logpath-*), and a
        cause matters only once the attempt has failed, printed just before the node died."""
        for node in self.plan.nodes:
            for chunk in _tail_chunks(node.log_path, HW_TAIL_BYTES):
                self.hardware_in(node.rank, node.host, chunk)

    def text(self, rank: int, host: str, text: str) -> Verdict | None:
        """lines() for a text of whole lines; a text nothing in which can matter costs one scan
        for the health patterns."""
        if may_matter(text) or (not self.milestones.training and milestones.may_matter(text)):
            return self.lines(rank, host, text[:-1].split("\n"))
        return None

    def tick(self) -> Verdict | None:
        """Periodic check for a hang; the stopping verdict if one fired now."""
        if not self.enabled:
            return None
        with self._lock:
            return self._take(self.monitor.tick())

    def steps(self) -> tuple[tuple, dict]:
        """(the job's last step and total, each node's (step, total)) for the live view."""
        with self._lock:
            m = self.monitor
            return (m.last_step, m.total_steps), dict(m.node_steps)

    def finish(self, ok: bool) -> None:
        with self._lock:
            if ok:
                self._take(self.monitor.finish())

    def _take(self, verdicts: list[Verdict]) -> Verdict | None:
        stop = None
        for v in verdicts:
            at = None
            if v.event == "first_step":   # one time for the event and the phase it ends
                at = utc_now()
                self.milestones.step(v.fields.get("step"), first=True, at=at)
            if v.event == "step":
                self._logged += 1
                if (self._logged - 1) % self.plan.job.health.log_every:
                    continue
            self.events.emit(v.event, at=at, **v.fields)
            if v.stop and self.enabled and self.verdict is None:
                self.verdict = stop = v
        return stop

    def dump_stacks(self) -> str:
        """py-spy dumps of every rank into logs/<run>/stacks/attempt<N>/; the one-line summary."""
        out_dir = os.path.join(self.plan.log_dir, "stacks", f"attempt{self.plan.attempt}")
        fsmode.private_dir(os.path.dirname(out_dir))
        fsmode.private_dir(out_dir)
        bindir = remote_bin(self.plan.job)
        # Under cluster.container the job's bin/ is inside the image: the host's py-spy reads
        # the ranks (processes of the host, in the container's namespaces).
        pyspy = posixpath.join(bindir, "py-spy") if bindir and not self.plan.job.cluster.container else "py-spy"
        # Per node, by its own id: a host may run several nodes, and hosts may share /proc.
        def dump(node) -> str:
            env = dict(node.env)
            script = render.stack_dump_script(f"MLAUNCH_NODE_ID={env['MLAUNCH_NODE_ID']}", pyspy)
            return self.executor.run(node.login, script, 60)[1]
        with ThreadPoolExecutor(max_workers=min(32, len(self.plan.nodes))) as pool:
            outputs = list(pool.map(dump, self.plan.nodes))
        found: list[stacks.RankStack] = []
        for output in outputs:
            found += stacks.split_dump(output)
        for s in found:
            fsmode.write_private(os.path.join(out_dir, f"node{s.node}-rank{s.rank}.txt"),
                                 self.plan.mask(s.text))
        line = stacks.summary(found)
        fix = stacks.advice(found)
        line += f"; {fix}" if fix else ""
        if said := stacks.refusals(outputs):   # not "no rank process found": nothing was tried there
            line = said if not found else f"{line}; {said}"
        self.events.emit("stacks", summary=line, dir=out_dir, ranks=len(found))
        return line

"""Following one Slurm job: its state, its per-node log files, Ctrl-C, and its JobResult.

slurmstepd writes each node's output, unmasked, to a file in the run's 0700 directory
(sbatch.RAW_DIR) on the shared storage; it is read from there, masked once (plan.mask),
appended to the node log and printed with the node prefixes. The raw file is removed once the
job has left its nodes and every byte of it is in the node log."""
from __future__ import annotations

import collections
import dataclasses
import os
import time

from ...transport.base import LOST, Exit
from ...session.outcome import SIGINT_EXIT, TIMEOUT_EXIT, JobResult, NodeOutcome
from .commands import (NEVER_EXIT, POLL_S, cancel_and_wait, hostnames, is_gone, job_info,
                    never_starts, node_outcomes)
from ...logs.stream import NodeLog, lines_of
from ...logs.tail import FileTail, log_iter
from ...logs.torchrun_out import ExitBarrierNoise, TorchrunRootCause
from ...session.nodeoutput import with_cause

STATE_POLL_MAX_S = 2.0


class _Tail(FileTail):
    """One node's file on the shared storage, read as it grows: its last lines and torchrun's
    root cause as they were read."""

    def __init__(self, path: str, rank: int | None = None):
        super().__init__(path, reopen=True)
        self.rank = rank
        self.tail: collections.deque[str] = collections.deque(maxlen=12)
        self.cause = TorchrunRootCause()
        self.noise = ExitBarrierNoise()   # torchrun's exit-barrier traceback: one console line


class Follow:
    """One submitted attempt, from the allocation to the job's end."""

    def __init__(self, plan, req, job_id: str, printer, on_started):
        self.plan, self.req, self.job_id = plan, req, job_id
        self.printer, self.on_started = printer, on_started
        self.hosts: list[str] = []
        self.tails: list[_Tail] = []
        self.logs: list[NodeLog] = []
        self.batch = _Tail(req.batch_log)
        self.info: dict[str, str] = {}
        self.interrupted = False
        self.watch = None
        self.verdict = None
        self.never: str | None = None   # why Slurm can never start the job, once it says so
        self._final = False   # the job has ended: what is left is read, nothing is stopped
        self._start = self._next_state = 0.0
        self._teardown = False   # the teardown phase is marked

    def run(self) -> JobResult:
        self._start = time.monotonic()
        try:
            self._read(self._done)
        except KeyboardInterrupt:
            self._cancel()
            self._read(lambda: True)   # what the job wrote until it ended
        self._close_logs()
        return self._result()

    def _read(self, should_stop) -> None:
        # Logs are read every POLL_S until the job ends (_done); then what is left of them.
        for tail, text in log_iter(lambda: [*self.tails, self.batch], should_stop, POLL_S):
            self._take(tail, text)

    def _done(self) -> bool:
        """Whether following ends now: the job has left its nodes, can never start, or was
        stopped for its health. slurmctld is asked less and less often (up to every
        STATE_POLL_MAX_S), so that a long queue wait or a long run costs it little."""
        now = time.monotonic()
        if now >= self._next_state:
            self.info = job_info(self.job_id)
            self._next_state = now + min(STATE_POLL_MAX_S, POLL_S + (now - self._start) / 30)
            state = self.info.get("JobState", "")
            if not self.hosts and (state in ("RUNNING", "COMPLETING") or is_gone(self.info)):
                self._allocated()
            if not self.hosts and (why := never_starts(self.info)):
                self._never_starts(why)
                self._final = True
        if self.watch is not None and not self._final and (verdict := self.watch.tick()) is not None:
            self._health_stop(verdict)
        if not self._final and is_gone(self.info) and self.info.get("JobState") != "COMPLETED":
            self._torn_down()   # a node failed and srun ended the others: the failure seen now
        self._final = self._final or self.verdict is not None or is_gone(self.info)
        return self._final

    def _torn_down(self) -> None:
        """The phase timeline's teardown mark, once, when mlaunch first sees the job failing
        (its end, a health stop, Ctrl-C): where the time back to training is counted from."""
        if self.watch is not None and not self._teardown:
            self._teardown = True
            self.watch.phase("teardown")

    def _allocated(self) -> None:
        """The job has its nodes: name them, record the attempt, start reading their logs."""
        names = hostnames(self.info.get("NodeList", "")) or ["?"] * len(self.plan.nodes)
        self.hosts = names[:len(self.plan.nodes)]
        nodes = tuple(dataclasses.replace(n, host=h, login=h, log_path=self.req.node_log(n.rank, h))
                      for n, h in zip(self.plan.nodes, self.hosts))
        self.plan = dataclasses.replace(self.plan, nodes=nodes)
        self.tails = [_Tail(self.req.raw_log(n.rank, n.host), n.rank) for n in nodes]
        self.logs = [NodeLog(n.log_path) for n in nodes]
        self.printer.say(f"slurm job {self.job_id} running on {', '.join(self.hosts)}")
        from ...watch.watch import Watch
        self.watch = Watch(self.plan, None, self.printer.say, time.monotonic)
        for n in nodes:
            self.watch.events.emit("node_start", node=n.rank, host=n.host, slurm_job=self.job_id)
        self.watch.phase("rendezvous")   # the allocation runs: the phase timeline's next mark
        self.on_started(self.plan)

    def _take(self, t: _Tail, text: str) -> None:
        if t.rank is None:   # the batch script's own lines
            for line in lines_of(text):
                if line.strip():
                    self.printer.say(f"slurm: {line}")
            return
        rank = t.rank
        t.cause.see_text(text)
        text = self.plan.mask(text)   # once: node log, console, tail, watch
        self.logs[rank].write(text)
        lines = lines_of(text)
        t.tail.extend(lines)
        if shown := t.noise.filter(text):
            self.printer.node_text(rank, self.hosts[rank], shown, masked=True)
        verdict = self.watch.lines(rank, self.hosts[rank], lines) if self.watch else None
        if verdict is not None and not self._final and self.verdict is None:
            self._health_stop(verdict)

    def _close_logs(self) -> None:
        """Close the node logs; once the job has left every node, remove srun's raw files
        (all they hold is in the node logs now, masked)."""
        for log in self.logs:
            log.close()
        if not is_gone(self.info):
            return
        for t in self.tails:
            try:
                os.unlink(t.path)
            except OSError:
                pass

    def _health_stop(self, verdict) -> None:
        self.verdict = verdict
        self._torn_down()
        self.printer.say(f"health: {verdict.event}: {verdict.message}; scancel {self.job_id}")
        cancel_and_wait(self.job_id)
        self.info = job_info(self.job_id)

    def _never_starts(self, why: str) -> None:
        """Waiting would be forever: say Slurm's reason, take the job out of the queue."""
        self.never = why
        fix = "cluster.slurm (partition, nodes, extra_sbatch such as cpus-per-task, mem, gres)"
        self.printer.say(f"slurm job {self.job_id} can never start: {why}; fix {fix}; "
                         f"scancel {self.job_id}")
        cancel_and_wait(self.job_id)
        self.info = job_info(self.job_id)

    def _cancel(self) -> None:
        self.interrupted = True
        self._torn_down()
        self.printer.say(f"interrupted: scancel {self.job_id} (Ctrl-C again to SIGKILL at once)")
        try:
            gone = cancel_and_wait(self.job_id)
        except KeyboardInterrupt:
            self.printer.say(f"second interrupt: scancel --signal=KILL {self.job_id}")
            gone = cancel_and_wait(self.job_id, kill=True)
        self.info = job_info(self.job_id)
        self.printer.say(f"slurm job {self.job_id} " + ("has left every node" if gone else
                                                        "is still on its nodes (see squeue)"))

    def _result(self) -> JobResult:
        state = self.info.get("JobState", "GONE")
        if state == "CANCELLED" and not self.interrupted and not self.never:
            # scancel from elsewhere (`mlaunch stop`, a user, an admin): a stop, never restarted.
            self.printer.say(f"slurm job {self.job_id} was cancelled")
            self.interrupted = True
        hosts = self.hosts or [n.host for n in self.plan.nodes]
        exits, first = node_outcomes(_all_lines(self.req.batch_log), state)
        # The other nodes of a failed task end by srun's own kill (--kill-on-bad-exit), not by
        # mlaunch; a scancel mlaunch sent (Ctrl-C, stop) is mlaunch's.
        by = "mlaunch (scancel)" if self.interrupted else f"srun (--kill-on-bad-exit after node{first} failed)"
        outcomes = []
        for n in self.plan.nodes:
            tail = self.tails[n.rank] if self.tails else None
            ex = exits.get(n.rank) or (Exit(0) if state == "COMPLETED" else Exit(143, detail="ended by Slurm"))
            ex = with_cause(ex, tail.cause) if tail else None   # never allocated: no exit code
            outcomes.append(NodeOutcome(n.rank, hosts[n.rank], exit=ex, tail=list(tail.tail) if tail else [],
                                        terminated=first is not None and n.rank != first
                                        and ex is not None and ex.code != 0, ended_by=by))
        result = JobResult(code=0, nodes=outcomes, interrupted=self.interrupted, first_failure=first,
                           health=self.verdict, never_starts=self.never)
        result.code = self._code(state, outcomes, first, result)
        if self.watch is not None:
            if result.code != 0:
                self.watch.hardware_in_logs()
            result.hardware = dict(self.watch.hardware)
            self.watch.finish(ok=result.code == 0)
        return result

    def _code(self, state: str, outcomes, first, result: JobResult) -> int:
        from ...watch.watch import EXIT_CODES
        if result.health is not None:
            return EXIT_CODES[result.health.event]
        if self.never:
            return NEVER_EXIT
        if self.interrupted:
            return SIGINT_EXIT
        if state == "COMPLETED":
            return 0
        if state in ("TIMEOUT", "DEADLINE"):
            result.timed_out = True
            return TIMEOUT_EXIT
        if state in ("NODE_FAIL", "BOOT_FAIL"):
            return LOST
        if first is not None:
            return outcomes[first].exit.code or LOST
        code = self.info.get("ExitCode", "1:0").split(":")
        return int(code[0]) or (128 + int(code[1]) if len(code) > 1 and code[1] != "0" else 1)


def _all_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().splitlines()
    except OSError:
        return []

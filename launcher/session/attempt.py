"""Running a plan: connect everywhere, start every node, stream, fail fast, tear down, report."""
from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from ..view import nodeview
from ..record import fsmode
from .. import render
from ..errors import UserError
from ..record import phases
from ..record.events import EventLog, utc_now
from ..plan.launch_plan import LaunchPlan, NodePlan
from ..transport.base import LOST, TEARDOWN_GRACE, Executor, Exit, Running, heartbeat_period
from ..logs.console import Console
from .nodeoutput import NodeOutput
from ..logs.stream import Printer
from .outcome import SIGINT_EXIT, TIMEOUT_EXIT, JobResult, NodeOutcome
from ..watch.watch import EXIT_CODES, Watch

SETTLE_S = 10.0  # after teardown, how long nodes get to report before their sessions are cut
AGENT_DRAIN_S = 1.0  # torchrun, its ranks gone, may copy their logs this long (templates/teardown.sh.j2)
LIVE_EVERY_S = 1.0  # status lines redrawn, live.json rewritten, gpu_sample events checked


def announce(plan: LaunchPlan, printer: Printer) -> None:
    """The attempt's log directory made (0700), and its first line said."""
    try:
        fsmode.private_dir(plan.log_dir)
    except OSError as e:
        raise UserError(f"cannot create log directory {plan.log_dir}: {e.strerror}; "
                        "pass --log-dir DIR") from None
    n = len(plan.nodes)
    printer.say(f"run {plan.run_id}: {n} node{'' if n == 1 else 's'}; logs in {plan.log_dir}")


def run_job(plan: LaunchPlan, executor: Executor, printer: Printer,
            timeout: float | None = None, connected: bool = False,
            on_started: Callable[[], None] | None = None) -> JobResult:
    """Connect to all hosts, then start all nodes; never a half-started cluster.

    timeout: a hard limit in seconds; past it the job is torn down and exits 124.
    connected: the executor is already connected (e.g. by preflight); it is not closed here.
    on_started: called once every node has started (the registry's `running`).
    """
    announce(plan, printer)
    try:
        problems = [] if connected else executor.connect()
        if problems:
            raise UserError(problems, header="cannot reach every host; nothing was started anywhere:")
        EventLog(os.path.join(plan.log_dir, "events.jsonl"), plan.run_id, plan.attempt).emit(
            phases.PHASE, phase="stage")
        executor.stage(plan)
        return _Session(plan, executor, printer, timeout, on_started).run()
    finally:
        if not connected:
            executor.close()


class _Session:
    """The running job: one NodeOutput thread per node (its exit to the main thread), the
    console following the node logs."""

    def __init__(self, plan: LaunchPlan, executor: Executor, printer: Printer,
                 timeout: float | None = None, on_started: Callable[[], None] | None = None):
        self.plan, self.executor, self.printer = plan, executor, printer
        self.on_started = on_started
        self.deadline = time.monotonic() + timeout if timeout else None
        self.events: queue.Queue[tuple[int, Exit]] = queue.Queue()
        self.outcomes = [NodeOutcome(n.rank, n.host) for n in plan.nodes]
        self.running: dict[int, Running] = {}
        self.result = JobResult(code=0, nodes=self.outcomes)
        self._teardown: threading.Thread | None = None
        self.watch = Watch(plan, executor, printer.say, time.monotonic)
        self.view = nodeview.LiveView(plan.run_id,
                                      [(n.rank, n.host) for n in plan.nodes])
        self._live_at = 0.0
        self.console = Console(printer, {n.rank: n.log_path for n in plan.nodes})

    def run(self) -> JobResult:
        try:
            self._start_all()
            self._wait_all()
        except KeyboardInterrupt:
            self._interrupt()
            self._drain()
        self._finish()
        return self.result

    def _start_all(self) -> None:
        self.printer.set_status(self.view.status_lines)
        self.watch.phase("start")
        # Every node's script is sent first, each node's log, events and output thread made
        # after: the last node of many starts as soon as it can, while the first ones' imports
        # already take the cores the launcher shares with them.
        with ThreadPoolExecutor(max_workers=min(32, len(self.plan.nodes))) as pool:
            released = list(pool.map(self._release, self.plan.nodes))
        for node, (running, at) in zip(self.plan.nodes, released):
            if running is not None:
                self._follow(node, running, at)
        threading.Thread(target=self._heartbeats, daemon=True).start()
        # A node that could not start has queued its failure: recording it (_record) makes it
        # the first failure and tears the others down, so the attempt fails with its exit.
        if all(running is not None for running, _ in released):
            self.watch.phase("rendezvous")
            if self.on_started is not None:
                self.on_started()

    def _heartbeats(self) -> None:
        # Until every node has reported, keep each node's hang-up guard from firing.
        period = heartbeat_period(self.plan.job.cluster.hangup_after_s)
        while any(o.exit is None for o in self.outcomes):
            for rank, running in list(self.running.items()):
                if self.outcomes[rank].exit is None:
                    running.heartbeat()
            time.sleep(period)

    def _release(self, node: NodePlan) -> tuple[Running | None, str]:
        """node's script sent (the node starts): its Running and when, or None where it
        could not start (its failure queued)."""
        try:
            os.close(fsmode.private_fd(node.log_path, os.O_WRONLY))   # there, empty, from the start
            running = self.executor.start(node)
        except Exception as e:  # a node that cannot start fails the job like one that exits
            self.events.put((node.rank, Exit(LOST, lost=True, detail=f"could not start: {e}")))
            return None, ""
        self.running[node.rank] = running   # a teardown from now on reaches it
        return running, utc_now()

    def _follow(self, node: NodePlan, running: Running, at: str) -> None:
        """A started node's event, console and output thread."""
        self.watch.events.emit("node_start", at=at, node=node.rank, host=node.host, log="spliced")
        self.console.follow(node.rank, node.host, node.log_path)
        out = NodeOutput(node, running, self.plan, self.view,
                         lambda text: self.console.offer(node.rank, node.host, text), self._watched)
        threading.Thread(target=self._output, args=(out,), daemon=True).start()

    def _output(self, out: NodeOutput) -> None:
        ended = out.run()
        self.outcomes[out.node.rank].tail = out.tail()
        self.events.put((out.node.rank, ended))

    def _watched(self, rank: int, host: str, text: str) -> None:
        if (verdict := self.watch.text(rank, host, text)) is not None:
            self._health_stop(verdict)

    def _wait_all(self) -> None:
        pending = {n.rank for n in self.plan.nodes}
        deadline = None
        while pending:
            try:
                rank, outcome = self.events.get(timeout=0.2)
            except queue.Empty:
                deadline = self._settle(deadline)
                self._check_deadline()
                self._live()
                verdict = self.watch.tick() if self._teardown is None else None
                if verdict is not None:
                    self._health_stop(verdict)
                continue
            pending.discard(rank)
            self._record(rank, outcome)

    def _live(self, force: bool = False) -> None:
        # Once a second: fresh status lines, live.json for `ps RUN`, a gpu_sample a minute.
        now = time.monotonic()
        if now - self._live_at < LIVE_EVERY_S and not force:
            return
        self._live_at = now
        self.view.steps(*self.watch.steps())
        self.printer.redraw()
        for fields in self.view.due_events():
            self.watch.events.emit("gpu_sample", **fields)
        try:
            nodeview.write_snapshot(self.plan.log_dir, self.view.snapshot())
        except OSError:
            pass  # the view is a convenience: a full disk must not stop the job

    def _record(self, rank: int, outcome: Exit) -> None:
        node = self.outcomes[rank]
        node.exit = outcome
        self.watch.events.emit("node_exit", node=rank, host=node.host, code=outcome.code,
                               lost=outcome.lost or None,
                               detail=(outcome.detail or None) if outcome.lost else None)
        node.terminated = self._teardown is not None and rank != self.result.first_failure
        if (outcome.code != 0 or outcome.lost) and self._teardown is None:
            self.result.first_failure = rank
            self.result.failed_at = time.monotonic()
            node.terminated = False
            self.printer.say(f"node{rank} {node.host}: {node.result}; tearing down the job on every host"
                             + self._noise_note())
            self._begin_teardown()
        # A node mlaunch tore down is "killed" even when its session closed first.
        state = "lost" if outcome.lost else f"exit {outcome.code}"
        if node.terminated:
            state = "killed" if outcome.lost else f"killed {outcome.code}"
        self.view.ended(rank, state)

    def _settle(self, deadline: float | None) -> float | None:
        # Once teardown is done, a node that still has not reported gets its session cut.
        if self._teardown is None or self._teardown.is_alive():
            return deadline
        deadline = deadline or time.monotonic() + SETTLE_S
        if time.monotonic() > deadline:
            for rank, running in self.running.items():
                if self.outcomes[rank].exit is None:
                    running.close()
        return deadline

    def _check_deadline(self) -> None:
        if self.deadline and time.monotonic() > self.deadline and self._teardown is None:
            self.result.timed_out = True
            self.printer.say("time limit reached: tearing down the job on every host" + self._noise_note())
            self._begin_teardown()

    def _health_stop(self, verdict) -> None:
        # The first health verdict stops the job; a hang first records where every rank is.
        if self._teardown is not None or self.result.health is not None:
            return
        self.result.health = verdict
        self.printer.say(f"health: {verdict.event}: {verdict.message}")
        if verdict.event == "hang" and self.plan.job.health.stack_dumps:
            self.printer.say(f"hang: {self.watch.dump_stacks()}")
        self.printer.say("tearing down the job on every host" + self._noise_note())
        self._begin_teardown()

    def _interrupt(self) -> None:
        self.result.interrupted = True
        self.printer.say("interrupted: tearing down (Ctrl-C again to kill at once)" + self._noise_note())
        self._begin_teardown()

    def _drain(self) -> None:
        try:
            self._wait_all_remaining()
        except KeyboardInterrupt:
            self.printer.say("second interrupt: SIGKILL to every process of the job")
            self._teardown_all(kill_now=True)
            self._wait_all_remaining()

    def _wait_all_remaining(self) -> None:
        missing = {o.rank for o in self.outcomes if o.exit is None and o.rank in self.running}
        while missing:
            try:
                rank, outcome = self.events.get(timeout=0.2)
            except queue.Empty:
                self._settle(None)
                continue
            if rank in missing:
                missing.discard(rank)
                self._record(rank, outcome)

    def _noise_note(self) -> str:
        # The one teardown line also stands for torchrun's own tracebacks on that signal: the
        # console stops at the teardown (_begin_teardown).
        if any(os.path.basename(n.argv[0]) == "torchrun" for n in self.plan.nodes if n.argv):
            return "; torchrun's SignalException tracebacks on it: node logs only"
        return ""

    def _begin_teardown(self) -> None:
        # Node output not yet on the console is left to the node logs: nothing here waits
        # for a terminal, and the nodes' agents are not kept draining into a full pipe.
        self.console.abandon()
        if self._teardown is None:
            self.watch.phase("teardown")
            self._teardown = threading.Thread(target=self._teardown_all, daemon=True)
            self._teardown.start()

    def _teardown_all(self, kill_now: bool = False) -> None:
        hosts = list(dict.fromkeys(n.login for n in self.plan.nodes))
        with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
            outs = pool.map(lambda h: self._teardown_host(h, kill_now), hosts)
            self.result.teardown.update(zip(hosts, outs))
        self.result.torn_down_at = time.monotonic()
        at = utc_now()   # one time for the event and the phase it begins
        self.watch.events.emit("teardown", at=at, hosts=self.result.teardown, kill_now=kill_now or None)
        if not kill_now:
            self.watch.phase("settle", at=at)   # every node reports its end

    def _teardown_host(self, host: str, kill_now: bool) -> str:
        nodes = [n for n in self.plan.nodes if n.login == host]
        agents = [n.pidfile for n in nodes if "--nproc-per-node" in n.argv]  # torchrun's
        logs = [n.argv[n.argv.index("--log-dir") + 1] for n in nodes if "--log-dir" in n.argv[:-1]]
        script = render.teardown_script(f"MLAUNCH_RUN_ID={self.plan.tag}",
                                        [n.pidfile for n in nodes], TEARDOWN_GRACE, kill_now,
                                        agents=agents, drain=AGENT_DRAIN_S, agent_logs=logs,
                                        containers=[n.container_rm for n in nodes if n.container_rm])
        code, out = self.executor.run(host, script, timeout=TEARDOWN_GRACE + 15)
        return out.strip().splitlines()[-1] if out.strip() else f"exit {code}"

    def _finish(self) -> None:
        # On success no sweep is needed: when a node's session closes, its hang-up guard ends
        # whatever of that node is still alive (e.g. orphaned dataloader workers).
        if self._teardown is not None:
            self._teardown.join()
        self.console.close(more="" if self._teardown is None else
                           f"; what ranks wrote after the teardown began is in their torchrun "
                           f"logs under {self.plan.run_dir}/torchrun on each host")
        self._live(force=True)
        self.printer.set_status(None)
        r = self.result
        r.last_step = self.watch.monitor.last_step
        ok = all(o.exit is not None and o.exit.code == 0 for o in self.outcomes)
        # A first attempt that ended well: its lines are in the node logs. After a restart the
        # folder (the run's, per node) also holds the failed attempt's, which the console pointed to.
        if ok and self._teardown is None and not r.interrupted and self.plan.attempt == 0:
            self.executor.drop_logs(torchrun_logs(self.plan))
        if not ok:
            self.watch.hardware_in_logs()
        self.watch.finish(ok=ok)
        r.hardware = dict(self.watch.hardware)
        if r.health is not None:
            r.code = EXIT_CODES[r.health.event]
        elif r.interrupted:
            r.code = SIGINT_EXIT
        elif r.timed_out:
            r.code = TIMEOUT_EXIT
        elif r.first_failure is not None:
            r.code = self.outcomes[r.first_failure].exit.code or LOST


def torchrun_logs(plan) -> dict[str, list[str]]:
    """Each host's torchrun --log-dir folders (login: folders); none for a node without torchrun.
    Only a folder under the run's own torchrun/ (launch_plan's): never a `--log-dir` of the
    job's own arguments, which a node without torchrun could hold."""
    import posixpath
    mine = posixpath.join(plan.run_dir, "torchrun") + "/"
    out: dict[str, list[str]] = {}
    for n in plan.nodes:
        if "--log-dir" in n.argv:
            d = n.argv[n.argv.index("--log-dir") + 1]
            if d.startswith(mine) and ".." not in d.split("/"):
                out.setdefault(n.login, []).append(d)
    return out

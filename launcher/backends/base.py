"""The one backend interface, after torchx's scheduler (`submit = schedule(dryrun(...))`) and
submitit's executor (a base that owns the I/O, a backend that fills a few hooks).

What every backend answers, for the CLI:

    plan(job, ...)    -> LaunchPlan  the plan, with the backend's placement of node ranks
    dryrun(plan)      -> Request     what `submit --dry-run` prints; touches nothing
    run(request)      -> exit code   run that request in the foreground until it ends
    submit(request)   -> exit code   run it detached under a supervisor; 0 once handed over
    describe(run)     -> Status      the run's state now (may find it lost)
    logs(run, node)   -> path        one node's log file of one attempt
    cancel(run)       -> Cancel      end every process of the run, wherever it is

The base owns all of that: the registry, the detached supervisor, the attempt loop
(launcher/runs/attempts.py), the node session that streams and tears down. A backend fills
the hooks below it; a new backend is its own package under launcher/backends/, one line in
the table of launcher/backends/__init__.py, and its tests.

Standard library only at module level: `mlaunch ps` imports it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

DETACHED = "mlaunch-supervisor: detached"   # the supervisor's last line on the pipe
STOP_WAIT_S = 120.0                           # how long stop waits for the supervisor
ACTIVE = ("starting", "running", "restarting")


@dataclass(frozen=True)
class Request:
    """A run ready to submit: the plan that runs and its printable form."""

    backend: str
    plan: Any          # launcher.plan.launch_plan.LaunchPlan
    text: str          # exactly what --dry-run prints


@dataclass(frozen=True)
class Status:
    """What describe() found."""

    state: str                 # one of registry.STATES
    exit_code: int | None = None
    detail: str = ""


@dataclass
class Cancel:
    """What cancel() did: processes left per host (all 0 is success) and any problems."""

    left: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    how: str = ""

    @property
    def clean(self) -> bool:
        return not self.problems and not any(self.left.values())


class Backend:
    """One way of running a plan's nodes. Subclasses fill the hooks (`connect`, and where
    the default does not fit: `placement`, `show`, `run_attempt`, `next_attempt`,
    `reach_nodes`, `interrupt`)."""

    name = ""
    # The nodes exist before the run starts, so submit's preflight can run on them (a
    # scheduler allocates them only when the batch job starts).
    preflight_at_submit = True
    # What `check` says it does not run at submit (a scheduler's backend says where it does).
    no_preflight_note = ""

    # ---- the plan -------------------------------------------------------------------------
    def placement(self, job) -> Any:
        """Where node ranks run, as the plan renders them; None: the spec's hosts."""
        return None

    def plan(self, job, **kw):
        """The plan of job as this backend runs it (launch_plan.build_plan's keywords)."""
        from ..plan.launch_plan import build_plan
        return build_plan(job, placement=self.placement(job), **kw)

    def show(self, plan, full: bool = False) -> str:
        """The dry-run text of plan."""
        from ..view.present import describe_plan
        from ..transport.staging import code_files
        return describe_plan(plan, full=full, list_code=code_files)

    def probe_spares(self, plan, printer=None):
        """cluster.spare_hosts checked beside the job's own connect: a spare that is a node under
        another name refused (UserError), then each spare logged in to without holding the job
        up. A probe whose wait() gives each failed spare's cause, or None (nothing to probe).
        printer: submit's, which says each failure as it comes; None: `check` says them."""
        return None

    def dryrun(self, plan, full: bool = False) -> Request:
        """The request that run/submit would run; nothing is contacted."""
        return Request(self.name, plan, self.show(plan, full))

    # ---- hooks of the attempt loop ---------------------------------------------------------
    def transport(self, plan):
        """The unconnected transport (launcher/transport/base.py's Executor) to plan's nodes."""
        raise NotImplementedError

    def connect(self, plan, warm: bool = False):
        """transport(plan), connected to every node; UserError naming every host that failed
        (nothing is started then). warm: submit's connect, whose nodes start warm() as each
        one is reached, not once the last one is (at 64 hosts the logins take a second)."""
        from ..errors import UserError
        executor = self.transport(plan)
        if warm:
            self.warm(plan, executor)
        problems = executor.connect()
        if problems:
            executor.close()
            raise UserError(problems, header="cannot reach every host; nothing was started anywhere:")
        return executor

    def warm(self, plan, executor) -> None:
        """At submit's connect (connect(warm=True)), on each node as soon as it is reached,
        before staging and preflight: start what the nodes can start before any check passed
        without running anything of the job (the SSH backend's warm start,
        cluster.warm_start); nothing by default."""

    def stage_inputs(self, plan, executor, printer) -> None:
        """cluster's staging: every staged item current on every node of plan, before
        preflight and before any node starts (transport/staging.py)."""
        from ..transport.staging import stage
        from ..transport.tokenize import tokenize_once
        tokenize_once(plan, executor, printer.say, stage(plan, executor, printer.say))

    def run_attempt(self, plan, executor, printer, on_started):
        """One attempt on every node: start, stream, fail fast, tear down; its JobResult."""
        from ..session.attempt import run_job
        return run_job(plan, executor, printer, connected=True, on_started=on_started)

    def next_attempt(self, job, plan, executor, result, printer, events):
        """After a failed attempt: (job, plan, executor) of the next one: reconnected, its
        hosts changed where spares (runs/spares.py) or a smaller world (runs/shrink.py) must
        take the failed nodes' places. plan is the recorded plan of the last attempt."""
        from ..runs import shrink, spares
        executor.close()
        if not job.cluster.spare_hosts and not shrink.allowed(job):
            return job, plan, self.connect(plan)
        return spares.reconnect(job, plan, result, printer, events,
                                lambda j: plan.replanned(job=j), self.transport)

    def control(self, plan, purpose: str):
        """For `check` and `exec`: (the plan on the nodes reached, a connected transport,
        the connect problems of the hosts that failed, each "host <login>": why)."""
        executor = self.transport(plan)
        return plan, executor, executor.connect()

    def check_rows(self, report, executor):
        """`check`'s report as this backend names its rows."""
        return report

    guard_exec = True   # exec's script keeps the node's hang-up guard

    def scripts(self, plan) -> dict[str, str]:
        """{file name: masked text} of the node scripts `mlaunch render` writes."""
        return {f"node{n.rank}.sh": "#!/bin/sh\n" + plan.mask(n.display) for n in plan.nodes}

    def reach_nodes(self, run, force: bool) -> Cancel:
        """End whatever of run is left on its nodes (after the supervisor, or without it)."""
        raise NotImplementedError

    def interrupt(self, run, force: bool) -> None:
        """Before the supervisor is interrupted (a scheduler cancels its job here)."""

    # ---- running ---------------------------------------------------------------------------
    def run(self, request: Request, opts, job) -> int:
        """Foreground: this process is the supervisor; SIGTERM (mlaunch stop) acts as Ctrl-C."""
        from ..record.recorder import Recorder
        from ..runs.attempts import run_request
        signal.signal(signal.SIGTERM, _interrupt)
        rec = Recorder(detached=False, supervisor=(os.getpid(), proc_start(os.getpid())),
                       backend=self.name)
        return run_request(request, opts, self, recorder=rec)

    def submit(self, request: Request, opts, job) -> int:
        """Detached: start a supervisor in its own session, relay its output until every node
        has started (or it failed), then return; its exit code if it never detached."""
        import json
        from dataclasses import asdict
        from ..spec.secret_rules import REF_SOURCES
        run_id = request.plan.run_id
        payload = json.dumps({"job": job.model_dump(mode="json", by_alias=True, exclude_unset=True),
                              "secret_env": sorted(job._secret_env),
                              "opts": {**asdict(opts), "run_id": run_id}, "backend": self.name,
                              "pythonpath": os.environ.get("PYTHONPATH"),   # the user's, restored there
                              "ref_sources": sorted(REF_SOURCES)})
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [pkg_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        # The spec (secrets included) travels on the pipe, never on the command line.
        proc = subprocess.Popen([sys.executable, "-m", "launcher.backends.supervisor", run_id],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, env=env)
        errs = threading.Thread(target=_copy, args=(proc.stderr, sys.stderr.buffer), daemon=True)
        errs.start()
        proc.stdin.write(payload.encode())
        proc.stdin.close()
        detached, interrupted = _relay(proc)
        errs.join(timeout=5)
        if not detached:
            code = proc.wait()
            return 130 if interrupted else code
        for line in [f"run {run_id} detached (supervisor pid {proc.pid})",
                     f"  follow: mlaunch logs -f {run_id}", f"  attach: mlaunch attach {run_id}",
                     "  status: mlaunch ps", f"  stop:   mlaunch stop {run_id}"]:
            print(f"[mlaunch] {line}", flush=True)
        return 0

    # ---- a registered run ------------------------------------------------------------------
    def describe(self, run) -> Status:
        """The state of a registered run (registry.Run) now."""
        if run.state not in ACTIVE:
            return Status(run.state, run.exit_code)
        token = run.id if run.detached else None
        if alive(run.supervisor_pid, run.supervisor_start, token):
            return Status(run.state, run.exit_code)
        return _ended(run) or Status("lost", None, f"supervisor pid {run.supervisor_pid} is gone")

    def logs(self, run, node: int, attempt: int | None = None) -> str:
        """Path of node's log file for attempt (default: the latest), from the registry."""
        from ..record.registry import Registry
        attempts = Registry().attempts(run.id)
        if not attempts:
            raise LookupError(f"run {run.id} started no node")
        pick = attempts[-1] if attempt is None else next((a for a in attempts if a.n == attempt), None)
        if pick is None:
            raise LookupError(f"run {run.id} has attempts 0..{attempts[-1].n}, not {attempt}")
        if not 0 <= node < len(pick.log_paths):
            raise LookupError(f"run {run.id} has nodes 0..{len(pick.log_paths) - 1}, not {node}")
        return pick.log_paths[node]

    def cancel(self, run, force: bool = False) -> Cancel:
        """Interrupt the supervisor as Ctrl-C would; then reach every node and end what is left."""
        from ..record.registry import Registry
        how = "nothing was running"
        if self.describe(run).state in ACTIVE:
            Registry().request_stop(run.id)
            self.interrupt(run, force)
            _signal(run.supervisor_pid, signal.SIGTERM)
            if force:  # a second interrupt: SIGKILL to every process of the job at once
                time.sleep(0.3)
                _signal(run.supervisor_pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_WAIT_S
            while alive(run.supervisor_pid, run.supervisor_start) and time.monotonic() < deadline:
                time.sleep(0.1)
            how = "the supervisor tore the run down"
        elif run.state in ACTIVE + ("lost",):
            how = "the supervisor is lost: reached every node directly"
        result = self.reach_nodes(Registry().get(run.id) or run, force)
        result.how = f"{how}; {result.how}" if result.how else how
        Registry().set_state(run.id, "stopped", only_from=ACTIVE, exit_code=130)
        return result


def proc_start(pid: int) -> int | None:
    """pid's start time in clock ticks since boot; None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = stat[stat.rindex(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):  # a killed process not yet reaped is gone all the same
        return None
    return int(fields[19])


def alive(pid: int | None, start: int | None, token: str | None = None) -> bool:
    """Is pid still the process that was recorded (same start time, token on its command line)?"""
    if not pid or proc_start(pid) != start:
        return False
    if token is None:
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return token.encode() in fh.read().split(b"\0")
    except OSError:
        return False


def _ended(run) -> Status | None:
    """How a run whose supervisor is gone ended, from its events.jsonl's run_end: the
    supervisor could not record it (a full or read-only registry), the run still ended so."""
    from ..record.recorder import STOPPED_EXIT
    from ..record.runevents import read
    ends = [e for e in read(run.log_dir) if e["event"] == "run_end"] if run.log_dir else []
    code = ends[-1].get("code") if ends else None
    if not isinstance(code, int):
        return None
    state = "succeeded" if code == 0 else "stopped" if code == STOPPED_EXIT else "failed"
    return Status(state, code, "its end was in events.jsonl, not in the registry")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _copy(src, dst) -> None:
    for chunk in iter(lambda: src.read1(65536), b""):
        dst.write(chunk)
        dst.flush()


def _relay(proc: subprocess.Popen) -> tuple[bool, bool]:
    """Echo the supervisor's lines until it detaches or ends; Ctrl-C here stops it."""
    interrupted = False
    while True:
        try:
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace")
                if line.rstrip("\n") == DETACHED:
                    return True, interrupted
                sys.stdout.write(line)
                sys.stdout.flush()
            return False, interrupted
        except KeyboardInterrupt:
            interrupted = True
            _signal(proc.pid, signal.SIGTERM)

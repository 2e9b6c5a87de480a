"""The ssh/local backend: mlaunch (foreground) or its supervisor (detached) drives the nodes.

The handle is the driving process: its pid plus a marker that survives pid reuse, its
start time (field 22 of /proc/<pid>/stat) and, for a supervisor, the run id on its
command line. Imports at module level are standard library only (`mlaunch ps`).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from .backend import Cancel, Request, Status

DETACHED = "mlaunch-supervisor: detached"   # the supervisor's last line on the pipe
STOP_WAIT_S = 120.0                           # how long stop waits for the supervisor


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


class ProcessBackend:
    """Backend `ssh` (or `local`): no scheduler; the handle is a supervising process."""

    def __init__(self, name: str = "ssh"):
        self.name = name

    def dryrun(self, plan, full: bool = False) -> Request:
        from ..view.present import describe_plan
        return Request(self.name, plan, describe_plan(plan, full=full))

    def run(self, request: Request, opts, job) -> int:
        """Foreground: this process is the supervisor; SIGTERM (mlaunch stop) acts as Ctrl-C."""
        from ..record.recorder import Recorder
        from .attempts import submit
        signal.signal(signal.SIGTERM, _interrupt)
        rec = Recorder(detached=False, supervisor=(os.getpid(), proc_start(os.getpid())),
                       backend=self.name)
        return submit(job, opts, recorder=rec)

    def submit(self, request: Request, opts, job) -> int:
        """Detached: start a supervisor in its own session, relay its output until every node
        has started (or it failed), then return; its exit code if it never detached."""
        import json
        from dataclasses import asdict
        run_id = request.plan.run_id
        payload = json.dumps({"job": job.model_dump(mode="json", by_alias=True, exclude_unset=True),
                              "secret_env": sorted(job._secret_env),
                              "opts": {**asdict(opts), "run_id": run_id}, "backend": self.name})
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [pkg_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        # The spec (secrets included) travels on the pipe, never on the command line.
        proc = subprocess.Popen([sys.executable, "-m", "launcher.launch.supervisor", run_id],
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

    def describe(self, run) -> Status:
        if run.state not in ("starting", "running", "restarting"):
            return Status(run.state, run.exit_code)
        token = run.id if run.detached else None
        if alive(run.supervisor_pid, run.supervisor_start, token):
            return Status(run.state, run.exit_code)
        return _ended(run) or Status("lost", None, f"supervisor pid {run.supervisor_pid} is gone")

    def logs(self, run, node: int, attempt: int | None = None) -> str:
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
        from .sweep import sweep
        how = "nothing was running"
        if self.describe(run).state in ("starting", "running", "restarting"):
            Registry().request_stop(run.id)
            os.kill(run.supervisor_pid, signal.SIGTERM)
            if force:  # a second interrupt: SIGKILL to every process of the job at once
                time.sleep(0.3)
                _signal(run.supervisor_pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_WAIT_S
            while alive(run.supervisor_pid, run.supervisor_start) and time.monotonic() < deadline:
                time.sleep(0.1)
            how = "the supervisor tore the run down"
        elif run.state in ("starting", "running", "restarting", "lost"):
            how = "the supervisor is lost: reached every node directly"
        result = sweep(run, kill_now=force)
        result.how = how
        Registry().set_state(run.id, "stopped", only_from=("starting", "running", "restarting"),
                             exit_code=130)
        return result


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

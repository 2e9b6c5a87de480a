"""The detached run's supervisor: `python -m launcher.backends.supervisor RUN_ID`.

Started by `mlaunch submit --detach` in a session of its own (no controlling terminal, so
a closed terminal's SIGHUP never reaches it). It reads the job from stdin, runs exactly
what the foreground submit runs (connect, preflight, output_dir guard, start, stream into
the log files, fail fast, restarts), and writes the run's progress to the registry. Its
stdout is the pipe to `mlaunch submit` until every node has started; then it says
DETACHED there and moves its stdout/stderr to a file, and the submitting command returns.
The run id on its command line is part of the pid marker `ps` checks.
"""
from __future__ import annotations

import json
import os
import signal
import sys

from ..record import fsmode
from .base import DETACHED, proc_start


def _restore_pythonpath(payload: dict) -> None:
    """The user's own PYTHONPATH back (or none): this process started with mlaunch's package
    root put first so that it could import itself, and what it starts (local nodes, Slurm's
    sbatch with its exported environment) must get what a foreground run gives them."""
    if "pythonpath" not in payload:
        return
    if payload["pythonpath"] is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = payload["pythonpath"]


def main(argv: list[str]) -> int:
    run_id = argv[0]
    payload = json.loads(sys.stdin.read())
    _restore_pythonpath(payload)
    from ..spec.secret_rules import REF_SOURCES
    REF_SOURCES.update(payload.get("ref_sources", ()))   # the shell variables the spec's `${NAME}` read
    _quiet_stdin()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _interrupt)   # mlaunch stop: the same teardown as Ctrl-C
    from ..errors import UserError
    from ..record.recorder import Recorder
    from ..spec.load import validate
    from ..runs.attempts import SubmitOptions, run_request
    from . import backend_for
    opts = SubmitOptions(**payload["opts"])
    assert opts.run_id == run_id
    rec = Recorder(detached=True, supervisor=(os.getpid(), proc_start(os.getpid())),
                   backend=payload["backend"])
    rec.on_detach = lambda: _detach(rec)
    try:
        job = validate(payload["job"], secret_env=payload.get("secret_env", ()))
        backend = backend_for(payload["backend"])
        # The same request `submit` made from the same spec and run id: the dry-run's plan.
        request = backend.dryrun(backend.plan(job, run_id=opts.run_id, log_dir=opts.log_dir))
        return run_request(request, opts, backend, recorder=rec)
    except UserError as e:
        for line in e.lines():
            print(f"mlaunch: {line}", file=sys.stderr, flush=True)
        return e.exit_code
    except KeyboardInterrupt:
        print("mlaunch: interrupted", file=sys.stderr, flush=True)
        return 130


def _quiet_stdin() -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)


def _detach(rec) -> None:
    """Tell `mlaunch submit` we are on our own; from now on nothing goes to its terminal."""
    try:
        sys.stdout.write(DETACHED + "\n")
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # `mlaunch submit` is gone already (its terminal closed): carry on
        pass
    log_dir = os.path.dirname(rec.console.path) if rec.console else "."
    try:
        fd = fsmode.private_fd(os.path.join(log_dir, "supervisor.log"), os.O_WRONLY | os.O_APPEND)
    except OSError:   # a full or read-only MLAUNCH_HOME: the run goes on, unheard
        fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

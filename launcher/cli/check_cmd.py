"""`mlaunch check JOB`: every preflight check on the job's nodes, reached through the job's
backend (a scheduler's allocates them first), as one table or JSON."""
from __future__ import annotations

import dataclasses
import os
import sys
import time


def check_command(job_path: str, *, as_json: bool, run_id: str | None = None,
                  overrides: tuple[str, ...] = ()) -> int:
    """Every check, one table (or JSON) on stdout; 0 all pass, 1 any fail."""
    from ..backends import backend_of
    from ..preflight.runner import Ctx, run_ctx, unreachable_ranks
    from ..spec import load_spec
    from ..spec.overrides import parse
    job = load_spec(job_path, parse(overrides))
    started = time.monotonic()   # the connects count: without them `check` reported near zero after long connects
    backend = backend_of(job)
    plan = backend.plan(job, run_id=run_id)
    spare_probe = backend.probe_spares(plan)   # refuses a spare that is a node under another name
    plan, executor, problems = backend.control(plan, "check")
    try:
        report = backend.check_rows(run_ctx(Ctx(plan, executor, unreachable_ranks(plan, problems))),
                                    executor)
    finally:
        executor.close()
    report = dataclasses.replace(report, seconds=time.monotonic() - started)
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR") and not as_json
    from ..spec.secret_rules import mask_data
    from ..plan.launch_plan import MASK
    sys.stdout.write(report.to_json(lambda d: mask_data(d, plan.secrets, MASK)) + "\n" if as_json
                     else plan.mask(report.table(color=color)))
    sys.stdout.flush()
    _say_spares(spare_probe, plan)
    return 0 if report.ok else 1


def _say_spares(probe, plan) -> None:
    """A warning line on stderr for each spare that failed its login (the table is the
    nodes'; a spare does not fail the check: the job does not need it), masked: ssh's words
    may hold what a ProxyCommand printed."""
    from ..backends.ssh import spares
    for spare, cause in (probe.wait() if probe else {}).items():
        print(plan.mask(f"mlaunch: warning: {spares.warning(spare, cause)}"), file=sys.stderr, flush=True)

"""Choosing a backend: the factory the backend interface (backend.py) does not import, and
`launch`, the CLI's submit through the chosen backend. Standard library only at module level:
`mlaunch ps` imports it."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .backend import Backend

if TYPE_CHECKING:
    from ..spec import JobBase
    from .attempts import SubmitOptions


def backend_for(name: str) -> Backend:
    """The backend registered under name (the registry's `backend` column)."""
    if name in ("ssh", "local"):
        from .process import ProcessBackend
        return ProcessBackend(name)
    if name == "slurm":
        from .slurm_backend import SlurmBackend
        return SlurmBackend()
    raise ValueError(f"unknown backend {name!r}")


def backend_name(plan: Any) -> str:
    """The backend that runs plan: slurm, local when every host is this machine, else ssh."""
    if plan.job.cluster.scheduler == "slurm":
        return "slurm"
    return "local" if plan.local else "ssh"


def launch(job: JobBase, opts: SubmitOptions, detach: bool = False) -> int:
    """The CLI's submit: through the run's backend, registered; detached or in the foreground."""
    from ..plan.launch_plan import build_plan
    from .attempts import check_offline
    check_offline(job, opts)   # what validate and --dry-run refuse, refused before connecting
    plan = build_plan(job, run_id=opts.run_id, log_dir=opts.log_dir)
    backend = backend_for(backend_name(plan))
    from ..record.recorder import check_registry
    check_registry()   # a locked one waits here; a damaged or read-only one: nothing starts
    request = backend.dryrun(plan)
    opts = dataclasses.replace(opts, run_id=plan.run_id)
    return backend.submit(request, opts, job) if detach else backend.run(request, opts, job)

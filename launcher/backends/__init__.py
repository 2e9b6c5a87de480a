"""The backends, chosen by name from one table, and `launch`: the CLI's submit through one.

Each backend is a package of its own under launcher/backends/ (the interface and the I/O
every backend shares are in base.py). Adding one is its package, one line in TABLE, and its
tests. Standard library only at module level: `mlaunch ps` imports it.

May import every layer below it (errors ... runs); only the CLI imports it. Only the packages
here touch SSH sessions, subprocesses of nodes, or a scheduler; nothing outside spec/ and
slurm/ here names that scheduler but TABLE's line.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING

from .base import Backend

if TYPE_CHECKING:
    from ..spec import JobBase
    from ..runs.attempts import SubmitOptions

# name -> "module:class". The registry's `backend` column holds the name.
TABLE = {
    "local": "launcher.backends.local:LocalBackend",
    "ssh": "launcher.backends.ssh:SSHBackend",
    "slurm": "launcher.backends.slurm:SlurmBackend",
    "ray": "launcher.backends.ray:RayBackend",
}


def backend_for(name: str) -> Backend:
    """The backend registered under name."""
    if name not in TABLE:
        raise ValueError(f"unknown backend {name!r} (known: {', '.join(TABLE)})")
    module, _, cls = TABLE[name].partition(":")
    return getattr(importlib.import_module(module), cls)()


def backend_name(job) -> str:
    """The backend that runs job: cluster.scheduler names it, and `ssh` whose hosts are all
    this machine is `local` (no SSH)."""
    from ..plan.launch_plan import all_local
    name = job.cluster.scheduler
    return "local" if name == "ssh" and all_local(job) else name


def backend_of(job) -> Backend:
    """The backend that runs job."""
    return backend_for(backend_name(job))


def launch(job: JobBase, opts: SubmitOptions, detach: bool = False) -> int:
    """The CLI's submit: the dry-run's request is what runs, registered; detached or in the
    foreground."""
    from ..runs.attempts import check_offline
    check_offline(job, opts)   # what validate and --dry-run refuse, refused before connecting
    backend = backend_of(job)
    request = backend.dryrun(backend.plan(job, run_id=opts.run_id, log_dir=opts.log_dir))
    from ..record.recorder import check_registry
    check_registry()   # a locked one waits here; a damaged or read-only one: nothing starts
    opts = dataclasses.replace(opts, run_id=request.plan.run_id)
    return backend.submit(request, opts, job) if detach else backend.run(request, opts, job)

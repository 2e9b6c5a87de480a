"""The only code that touches SSH, subprocesses or a scheduler: backends, executors, the job runner.

Names are imported lazily: `mlaunch ps` imports the backend seam without the runner's
dependencies (jinja2, pydantic, fabric).
"""
from __future__ import annotations

__all__ = ["JobResult", "make_executor", "run_job"]


def __getattr__(name: str):
    if name in __all__:
        from . import job
        return getattr(job, name)
    raise AttributeError(name)

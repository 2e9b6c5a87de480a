"""`mlaunch check` of a Slurm spec: the same checklist on the nodes of one allocation.

The nodes exist only inside an allocation, so check takes one (salloc, the job's own
options), names the plan's nodes after it, runs every probe and the all-reduce through
srun (alloc.py), and gives the allocation back. The ssh row becomes the
allocation row.
"""
from __future__ import annotations

import dataclasses

from ...errors import UserError
from ...preflight.report import CheckResult, Report


def allocated(plan, purpose: str = "check"):
    """(plan on the allocated nodes, its executor); UserError when Slurm refuses."""
    from .alloc import AllocationExecutor, scratch_dir
    executor = AllocationExecutor(plan.job, scratch_dir(plan.job, purpose))
    problems = executor.connect()
    if problems:
        executor.close()
        raise UserError(problems, header=f"no Slurm allocation for the {purpose}; nothing ran:")
    nodes = tuple(dataclasses.replace(n, host=h, login=h) for n, h in zip(plan.nodes, executor.hosts))
    return dataclasses.replace(plan, nodes=nodes), executor


def relabel(report: Report, job_id: str | None) -> Report:
    """The ssh rows as the allocation row: which job holds the node, and srun reached it."""
    rows = tuple(CheckResult("allocation", r.node, r.host, r.status,
                             f"slurm job {job_id}: srun reaches it") if r.check == "ssh" else r
                 for r in report.results)
    return dataclasses.replace(report, results=rows)

"""The only code that touches SSH or subprocesses: executors and the job runner."""
from __future__ import annotations

import sys
from typing import TextIO

from ..plan import LaunchPlan
from .job import JobResult, make_executor, run_job
from .stream import Printer


def run_plan(plan: LaunchPlan, out: TextIO | None = None) -> int:
    """Execute plan on its nodes, print the summary, and return the job's exit code."""
    from ..present import describe_result
    printer = Printer(plan.mask, out or sys.stdout)
    result = run_job(plan, make_executor(plan), printer)
    for line in describe_result(plan, result).splitlines():
        printer.say(line)
    return result.code


__all__ = ["JobResult", "make_executor", "run_job", "run_plan"]

"""The only code that touches SSH or subprocesses: executors and the job runner."""
from .job import JobResult, make_executor, run_job

__all__ = ["JobResult", "make_executor", "run_job"]

"""Preflight: the seeds' checklist on every node in parallel, as one table.

`mlaunch check JOB` runs every check (check_command); `mlaunch submit` runs the fast ones
(run_checks(..., fast_only=True)) and refuses to start on a failure. Modules:
probe (talking to nodes), software, gpu, network, master, ifname, storage, clock, collective
(the checks), report (table and JSON), runner (putting it together), slurm_check.

May import: errors, render, nodeprog, spec, plan, record, view, execute.
"""
from .report import CHECKS, CheckResult, Report
from .runner import check_command, run_checks

__all__ = ["CHECKS", "CheckResult", "Report", "check_command", "run_checks"]

"""Preflight: the seeds' checklist on every node in parallel, as one table.

`mlaunch check JOB` runs every check (launcher/cli/check_cmd.py); `mlaunch submit` runs the fast ones
(run_checks(..., fast_only=True)) and refuses to start on a failure. Modules:
probe (talking to nodes), software, gpu, network, master, ifname, storage, clock, collective
(the checks), report (table and JSON), runner (putting it together).

May import: errors, render, nodeprog, spec, plan, record, view, logs, watch, transport, session.
"""
from .report import CHECKS, CheckResult, Report
from .runner import run_checks

__all__ = ["CHECKS", "CheckResult", "Report", "run_checks"]

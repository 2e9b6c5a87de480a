"""Backend `slurm`: the run is a chain of sbatch jobs (one per attempt), driven by mlaunch.

Foreground or detached, an mlaunch process (the supervisor) submits each attempt, follows
its logs and chains the next attempt on a failure; the registry's handle holds the job ids.
`stop` interrupts that process (it scancels and waits); whatever it leaves, or when it is
lost, stop scancels every recorded job id itself and waits until the jobs are gone.
Standard library only at module level (`mlaunch ps` imports backends).
"""
from __future__ import annotations

import os
import signal
import time

from .backend import Cancel, Request
from .process import STOP_WAIT_S, ProcessBackend, alive


class SlurmBackend(ProcessBackend):
    """sbatch / scontrol / scancel behind the same five calls as the ssh backend."""

    def __init__(self) -> None:
        super().__init__("slurm")

    def dryrun(self, plan, full: bool = False) -> Request:
        """The batch script and the node script are always shown in full."""
        from ..view.present import describe_sbatch as describe
        return Request(self.name, plan, describe(plan))

    def cancel(self, run, force: bool = False) -> Cancel:
        from ..record.registry import Registry
        from ..execute.slurm import cancel_and_wait, is_gone, job_info, slurm_cmd
        how = []
        if self.describe(run).state in ("starting", "running", "restarting"):
            Registry().request_stop(run.id)
            # scancel at once (the supervisor's own scancel then finds it going), then let the
            # supervisor wait for the job to leave, record the attempt and exit.
            for job_id in _job_ids(run)[-1:]:
                slurm_cmd(["scancel", *(["--signal=KILL", "--full"] if force else []), job_id])
            os.kill(run.supervisor_pid, signal.SIGTERM)
            if force:  # a second interrupt: scancel --signal=KILL
                time.sleep(0.3)
                _signal(run.supervisor_pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_WAIT_S
            while alive(run.supervisor_pid, run.supervisor_start) and time.monotonic() < deadline:
                time.sleep(0.1)
            how.append("mlaunch cancelled its job")
        run = Registry().get(run.id) or run
        ids = _job_ids(run)
        result = Cancel()
        for job_id in ids:
            if not is_gone(job_info(job_id)):
                how.append(f"scancel {job_id}")
                if not cancel_and_wait(job_id, kill=force):
                    result.problems.append(f"slurm job {job_id} is still on its nodes after "
                                           "scancel; see `squeue -j {job_id}`")
        hosts = run.hosts or ["slurm"]
        result.left = {h: 0 for h in hosts} if not result.problems else {h: 1 for h in hosts}
        result.how = "; ".join(how) or "nothing was running"
        result.how += f" (slurm jobs {', '.join(ids)} gone)" if ids and not result.problems else ""
        Registry().set_state(run.id, "stopped", only_from=("starting", "running", "restarting"),
                             exit_code=130)
        return result


def _job_ids(run) -> list[str]:
    """Every sbatch job of the run (one per attempt), oldest first."""
    h = run.handle
    return h.get("job_ids") or ([h["job_id"]] if h.get("job_id") else [])


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass

"""Backend `slurm`: the run is a chain of sbatch jobs (one per attempt), driven by mlaunch.

Foreground or detached, an mlaunch process (the supervisor) submits each attempt, follows
its logs and chains the next attempt on a failure; the registry's handle holds the job ids.
`stop` interrupts that process (it scancels and waits); whatever it leaves, or when it is
lost, stop scancels every recorded job id itself and waits until the jobs are gone.

Holds commands (sbatch, squeue, scontrol, scancel), sbatch (the batch request rendered from
a plan), executor (one attempt as one batch job), alloc (srun inside an allocation, for
check and exec), check (the checklist on an allocation), exclude (a restart without the
nodes that failed), show (the dry-run view). Standard library only at module level
(`mlaunch ps` imports the backends).
"""
from __future__ import annotations

from ..base import Backend, Cancel


class SlurmBackend(Backend):
    """sbatch / scontrol / scancel behind the interface of launcher/backends/base.py."""

    name = "slurm"
    preflight_at_submit = False
    no_preflight_note = ("slurm: submit runs no preflight on nodes it does not have yet; "
                         "`mlaunch check` runs it through srun")
    guard_exec = False   # srun ends its own steps

    def placement(self, job):
        from ...plan.launch_plan import Placement
        s = job.cluster.slurm
        return Placement(nodes=s.nodes if s else 0, master="MLAUNCH_MASTER_ADDR",
                         rank_var="SLURM_NODEID", one_node_job="a one-node Slurm job (srun)")

    def show(self, plan, full: bool = False) -> str:
        from .show import describe_sbatch   # the scripts are always shown in full
        return describe_sbatch(plan)

    def scripts(self, plan) -> dict[str, str]:
        from .sbatch import request
        return {"job.sbatch": plan.mask(request(plan).script),
                "node.sh": "#!/bin/sh\n" + plan.mask(plan.nodes[0].display)}

    def transport(self, plan):
        from .executor import SlurmExecutor
        return SlurmExecutor()

    def run_attempt(self, plan, executor, printer, on_started):
        """One attempt as one batch job; on_started is called queued (the job id), then
        with every node started."""
        from ...session.attempt import announce
        announce(plan, printer)
        return executor.run_plan(plan, printer, on_started)

    def next_attempt(self, job, plan, executor, result, printer, events):
        """Slurm picks the nodes: the next sbatch excludes the failed ones, and asks for fewer
        when too few are left (min_nodes)."""
        from .exclude import exclude_failed, fit
        executor.close()
        job = fit(exclude_failed(job, result, printer, events), printer, events)
        plan = plan.replanned(job=job, placement=self.placement(job))
        return job, plan, self.connect(plan)

    def control(self, plan, purpose: str):
        """(plan on the allocated nodes, srun into them, no problem) for check and exec:
        the nodes exist only inside an allocation (salloc with the job's own options)."""
        from .check import allocated
        return (*allocated(plan, purpose), [])

    def check_rows(self, report, executor):
        from .check import relabel
        return relabel(report, executor.job_id)

    def interrupt(self, run, force: bool) -> None:
        """scancel at once (the supervisor's own scancel then finds it going), then the
        supervisor waits for the job to leave, records the attempt and exits."""
        from .commands import slurm_cmd
        for job_id in _job_ids(run)[-1:]:
            slurm_cmd(["scancel", *(["--signal=KILL", "--full"] if force else []), job_id])

    def reach_nodes(self, run, force: bool) -> Cancel:
        """scancel every job id the run recorded and wait until each has left its nodes."""
        from .commands import cancel_and_wait, is_gone, job_info
        ids, how, result = _job_ids(run), [], Cancel()
        for job_id in ids:
            if not is_gone(job_info(job_id)):
                how.append(f"scancel {job_id}")
                if not cancel_and_wait(job_id, kill=force):
                    result.problems.append(f"slurm job {job_id} is still on its nodes after "
                                           f"scancel; see `squeue -j {job_id}`")
        hosts = run.hosts or ["slurm"]
        result.left = {h: 1 if result.problems else 0 for h in hosts}
        result.how = "; ".join(how)
        result.how += f" (slurm jobs {', '.join(ids)} gone)" if ids and not result.problems else ""
        return result


def _job_ids(run) -> list[str]:
    """Every sbatch job of the run (one per attempt), oldest first."""
    h = run.handle
    return h.get("job_ids") or ([h["job_id"]] if h.get("job_id") else [])

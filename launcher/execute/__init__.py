"""Side effects on nodes: the only code below launch/ that touches SSH, subprocesses or a
scheduler.

Holds base (the Executor interface, exits, timing), ssh and local (executors), openssh and
openssh_running (the `ssh` clients that carry node streams and, over their connections, the
short scripts), ssh_paramiko (why a login failed), spool/spliced/follow/tail (node output into the node logs,
and read back from them), fanout_exec
(`mlaunch exec` on every node), slurm
(sbatch/squeue/scancel), slurm_executor and slurm_follow (one attempt as a batch job),
slurm_alloc (helpers inside an allocation), job (one attempt on every node: start, stream,
fail fast, tear down), stream (node-prefixed printing and the node logs), torchrun_out
(torchrun's root-cause report),
hwcause (hardware-looking errors), console (the bounded console queue), watch, health and
stacks (progress, hangs, NaNs, world size, py-spy dumps), outcome (what each node came to).

May import: errors, render, nodeprog, spec, plan, record, view. Names are imported lazily:
nothing here loads the runner's dependencies (jinja2, pydantic, fabric) on `mlaunch ps`'s path.
"""
from __future__ import annotations

__all__ = ["JobResult", "run_job"]


def __getattr__(name: str):
    if name in __all__:
        from . import job
        return getattr(job, name)
    raise AttributeError(name)

"""A plan as one Slurm batch job: the sbatch script, the node script and the secrets file.

Pure, like plan.py: text only; execute/slurm.py writes the files and talks to Slurm.
Layout of one attempt (suffix ".attemptN" from the second attempt on):
    run_dir/job<suffix>.sbatch      what sbatch gets (and `mlaunch render` writes)
    run_dir/node.sh                 every srun task runs it: torchrun --node-rank $SLURM_NODEID
    run_dir/secrets/env.sh          0600 in a 0700 dir; sourced by node.sh; removed at the end
    log_dir/node<k>-<host><suffix>.log   srun's --output=node%n-%N<suffix>.log
    log_dir/sbatch<suffix>.log      the batch script's own output (srun's messages)
"""
from __future__ import annotations

import os
import posixpath
import shlex
from dataclasses import dataclass

from .. import render
from .launch_plan import SECRETS_FILE, LaunchPlan
from ..spec.secret_rules import secret_env
from .trainers import RenderedFile

# The slurm block's fields and the sbatch option each becomes.
BLOCK_OPTIONS = ("partition", "account", "qos", "time", "constraint", "reservation")


@dataclass(frozen=True)
class SlurmRequest:
    """Everything sbatch needs for one attempt, as files to write before submitting."""

    script_path: str
    script: str                      # the batch script (no secret in it)
    node_script: RenderedFile        # node.sh, secrets masked out
    secrets: RenderedFile | None     # export lines of the secret env values, or None
    batch_log: str
    node_log_pattern: str            # srun's --output pattern (%n, %N)

    def node_log(self, rank: int, host: str) -> str:
        """One node's log file once its host is known."""
        return self.node_log_pattern.replace("%n", str(rank)).replace("%N", host).replace("%%", "%")


def attempt_suffix(plan: LaunchPlan) -> str:
    return f".attempt{plan.attempt}" if plan.attempt else ""


def request(plan: LaunchPlan) -> SlurmRequest:
    """The batch job of plan (one attempt)."""
    job, suffix = plan.job, attempt_suffix(plan)
    s = job.cluster.slurm
    log_dir = os.path.abspath(plan.log_dir)
    pattern = posixpath.join(log_dir.replace("%", "%%"), f"node%n-%N{suffix}.log")
    batch_log = posixpath.join(log_dir.replace("%", "%%"), f"sbatch{suffix}.log")
    node_path = posixpath.join(plan.run_dir, "node.sh")
    secrets = _secrets(plan)
    options = [(name, getattr(s, name)) for name in BLOCK_OPTIONS if getattr(s, name)]
    options += [("exclusive", None)] if s.exclusive else []
    options += [(k.lstrip("-"), None if v is True else v) for k, v in s.extra_sbatch.items()]
    script = render.render(
        "slurm.sbatch.j2", run_id=plan.run_id, job_name=job.name, nodes=s.nodes,
        gpus=job.cluster.gpus_per_node, batch_log=batch_log, options=options,
        secrets_file=secrets.path if secrets else None, node_log=pattern, node_script=node_path)
    return SlurmRequest(script_path=posixpath.join(plan.run_dir, f"job{suffix}.sbatch"),
                        script=script, node_script=RenderedFile(node_path, plan.nodes[0].script),
                        secrets=secrets, batch_log=batch_log.replace("%%", "%"),
                        node_log_pattern=pattern)


def step_argv(plan: LaunchPlan, name: str) -> list[str]:
    """srun of a one-task, one-node job of its own whose shell reads a script on stdin (never
    on a command line: it may export cluster.env values, and srun's argv is in ps and in
    Slurm's job record), on a node of the job's partition with the job's account, qos, time,
    constraint, reservation and exclusions: for a helper that needs what the nodes have
    (e.g. the trainer's DeepSpeed) and the shared storage, not the login node's software."""
    s = plan.job.cluster.slurm
    opts = [f"--{n}={getattr(s, n)}" for n in BLOCK_OPTIONS if getattr(s, n)]
    if excluded := s.extra_sbatch.get("exclude") or s.extra_sbatch.get("--exclude"):
        opts.append(f"--exclude={excluded}")
    return ["srun", "--nodes=1", "--ntasks=1", f"--job-name={plan.run_id}-{name}", *opts,
            "/bin/sh", "-s"]


def _secrets(plan: LaunchPlan) -> RenderedFile | None:
    env = [(k, v) for k, v in plan.job.cluster.env.items() if secret_env(plan.job, k, v)]
    if not env:
        return None
    text = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env)
    return RenderedFile(posixpath.join(plan.run_dir, SECRETS_FILE), text)

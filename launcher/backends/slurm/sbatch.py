"""A plan as one Slurm batch job: the sbatch script, the node script and the secrets file.

Pure: text only; executor.py writes the files and commands.py talks to Slurm.
Layout of one attempt (suffix ".attemptN" from the second attempt on):
    run_dir/job<suffix>.sbatch      what sbatch gets (and `mlaunch render` writes)
    run_dir/node.sh                 every srun task runs it: torchrun --node-rank $SLURM_NODEID
    run_dir/secrets/env.sh          0600 in a 0700 dir; sourced by node.sh; removed at the end
    run_dir/output/node<k>-<host><suffix>.log   srun's --output: the ranks' words as printed,
                                    secrets too, readable by this user alone (0700 dirs)
    log_dir/node<k>-<host><suffix>.log   the same, masked, 0600: written by mlaunch as it
                                    follows the job (backends/slurm/follow.py)
    log_dir/sbatch<suffix>.log      the batch script's own output (srun's messages)
"""
from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass

from ... import render
from ...plan.launch_plan import SECRETS_FILE, LaunchPlan, user_env
from ...spec.secret_rules import secret_env
from ...plan.trainers import RenderedFile

# The slurm block's fields and the sbatch option each becomes.
BLOCK_OPTIONS = ("partition", "account", "qos", "time", "constraint", "reservation")
RAW_DIR = "output"   # under run_dir: srun's unmasked node output


@dataclass(frozen=True)
class SlurmRequest:
    """Everything sbatch needs for one attempt, as files to write before submitting."""

    script_path: str
    script: str                      # the batch script (no secret in it)
    node_script: RenderedFile        # node.sh, secrets masked out
    secrets: RenderedFile | None     # export lines of the secret env values, or None
    batch_log: str
    node_log_pattern: str            # the masked node logs' pattern (%n, %N)
    raw_log_pattern: str = ""        # srun's --output pattern, in the private run dir

    def node_log(self, rank: int, host: str) -> str:
        """One node's (masked) log file once its host is known."""
        return _fill(self.node_log_pattern, rank, host)

    def raw_log(self, rank: int, host: str) -> str:
        """The file srun writes that node's output to (unmasked, in the 0700 run dir)."""
        return _fill(self.raw_log_pattern, rank, host)


def _fill(pattern: str, rank: int, host: str) -> str:
    return pattern.replace("%n", str(rank)).replace("%N", host).replace("%%", "%")


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
    raw = posixpath.join(plan.run_dir.replace("%", "%%"), RAW_DIR, f"node%n-%N{suffix}.log")
    secrets = _secrets(plan)
    options = [(name, getattr(s, name)) for name in BLOCK_OPTIONS if getattr(s, name)]
    options += [("exclusive", None)] if s.exclusive else []
    options += [(k.lstrip("-"), None if v is True else v) for k, v in s.extra_sbatch.items()]
    script = render.render(
        "slurm.sbatch.j2", run_id=plan.tag, job_name=job.name, nodes=s.nodes,
        gpus=job.cluster.gpus_per_node, batch_log=batch_log, options=options,
        secrets_file=secrets.path if secrets else None, raw_log=raw, node_script=node_path,
        container=_srun_container(plan))
    return SlurmRequest(script_path=posixpath.join(plan.run_dir, f"job{suffix}.sbatch"),
                        script=script, node_script=RenderedFile(node_path, plan.nodes[0].script),
                        secrets=secrets, batch_log=batch_log.replace("%%", "%"),
                        node_log_pattern=pattern, raw_log_pattern=raw)


def _srun_container(plan: LaunchPlan) -> str | None:
    """pyxis's options for the job's srun (cluster.container with runtime pyxis), else None:
    other runtimes wrap torchrun inside the node script."""
    k = plan.job.cluster.container
    return plan.nodes[0].container if k is not None and k.runtime == "pyxis" else None


def step_argv(plan: LaunchPlan, name: str) -> list[str]:
    """srun of a one-task, one-node job of its own whose shell reads a script on stdin (never
    on a command line: it may export cluster.env values, and srun's argv is in ps and in
    Slurm's job record), on a node of the job's partition with the job's account, qos, time,
    constraint, reservation and exclusions: for a helper that needs what the nodes have
    (e.g. the trainer's DeepSpeed) and the shared storage, not the login node's software."""
    s = plan.job.cluster.slurm
    options = [(n, getattr(s, n)) for n in BLOCK_OPTIONS if getattr(s, n)]
    if excluded := s.extra_sbatch.get("exclude") or s.extra_sbatch.get("--exclude"):
        options.append(("exclude", excluded))
    return render.argv_lines("slurm_step.j2", tag=plan.tag, name=name, options=options)


def _secrets(plan: LaunchPlan) -> RenderedFile | None:
    # as the ssh node script sets it: the value the ranks get (a `${NAME}` of another name is
    # kept with its `$` doubled), a `$NAME` of the node's own expanded there
    secrets = {k: v for k, v in plan.job.cluster.env.items() if secret_env(plan.job, k, v)}
    env = list(user_env(secrets).items())
    if not env:
        return None
    return RenderedFile(posixpath.join(plan.run_dir, SECRETS_FILE), render.secrets_env(env))

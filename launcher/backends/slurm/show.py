"""The dry-run view of a Slurm plan: how Slurm places the nodes, the batch script, the node
script and every file, exactly as submit writes them."""
from __future__ import annotations

from ...plan.launch_plan import LaunchPlan
from ...transport.staging import code_files
from ...view.present import describe_plan
from .sbatch import request


SHRINK_HOW = ("when the excluded nodes leave fewer usable nodes in the partition, the restart job "
              "asks for fewer (sbatch --nodes)")


def placement_lines(plan: LaunchPlan) -> tuple[str, ...]:
    """What the plan's header says of Slurm: the nodes, the restarts, the preflight."""
    n, job = len(plan.nodes), plan.job
    lines = [f"scheduler: slurm, {n} node{'' if n == 1 else 's'} from the allocation"]
    if job.max_restarts:
        lines.append("restarts under slurm: each is a new sbatch job; a restart excludes the "
                     "nodes that failed (drained, down or failing in scontrol, or a lost "
                     "task): --exclude, accumulated across attempts")
    lines.append("preflight: none at submit under Slurm (no node is allocated before sbatch); "
                 "`mlaunch check` runs it through srun")
    return tuple(lines)


def describe_sbatch(plan: LaunchPlan) -> str:
    """The batch script, the node script, the secrets file (masked) and every file."""
    req = request(plan)
    head = describe_plan(plan, with_nodes=False, placed=placement_lines(plan), list_code=code_files,
                         shrink_how=SHRINK_HOW).rstrip("\n")
    parts = [head, f"sbatch: {req.script_path} (submitted with sbatch --parsable)",
             f"node logs: {req.node_log_pattern.replace('%%', '%')} (%n node, %N host)", "",
             f"=== batch script {req.script_path} ===", req.script.rstrip("\n"), "",
             f"=== node script {req.node_script.path} (every node; rank from $SLURM_NODEID) ===",
             plan.nodes[0].display.rstrip("\n")]
    if req.secrets:
        parts += ["", f"=== file {req.secrets.path} (0600, removed when the job ends) ===",
                  plan.mask(req.secrets.content).rstrip("\n")]
    for f in plan.files:  # the ssh view's file blocks: the note (where values come from) first
        parts += ["", f"=== file {f.path} ==="] + [f"# {line}" for line in (f.note or "").splitlines()]
        parts.append(f.content.rstrip("\n"))
    return plan.mask("\n".join(parts) + "\n")

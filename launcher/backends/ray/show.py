"""The dry-run view of a Ray plan: the placement request (one bundle per node, strictly
spread), where the master comes from, then every node's command as the ssh view shows it."""
from __future__ import annotations

import json

from ...plan.launch_plan import LaunchPlan
from ...spec.ray_rules import bundle
from ...transport.staging import code_files
from ...view.present import describe_plan
from .connect import agent_name, group_name


SHRINK_HOW = "when fewer live Ray nodes than asked can hold a bundle, the restart places fewer bundles"


def placement_lines(plan: LaunchPlan) -> tuple[str, ...]:
    """What the plan's header says of Ray: the request, the master, restarts, preflight."""
    c, n = plan.job.cluster, len(plan.nodes)
    want = json.dumps(bundle(c), sort_keys=True)
    lines = [f"scheduler: ray at {c.ray.address} (namespace {c.ray.namespace})",
             f"ray placement group {group_name(plan.run_id)}: {n} bundle{'' if n == 1 else 's'} "
             f"of {want}, strategy STRICT_SPREAD (every node on another Ray node), placed within "
             f"{c.ray.placement_timeout_s:g}s",
             f"ray agents: {agent_name(plan.run_id, 0)}..node{n - 1}, one per bundle; each runs its "
             "node's script under the node relay and torchrun under cluster.python",
             "master: bundle 0's Ray node IP (MLAUNCH_MASTER_ADDR), port "
             f"{c.master_port} (cluster.master_port)"]
    if bundle(c).get("GPU"):
        lines.append("GPUs: Ray sets each agent's CUDA_VISIBLE_DEVICES to its bundle's GPUs, and the "
                     "node's torchrun and ranks inherit it (where a node line below says it is not "
                     "set, mlaunch sets none itself)")
    if plan.job.max_restarts:
        lines.append("restarts under ray: a new placement group each; a lost Ray node's bundle "
                     "goes to another Ray node" + (" or the world shrinks (cluster.min_nodes)"
                                                   if c.min_nodes and c.min_nodes < n else ""))
    lines.append("preflight: on the placed bundles, through their agents (enough nodes, the "
                 "trainer importable, the master port free on bundle 0's node)")
    return tuple(lines)


def describe_ray(plan: LaunchPlan, full: bool = False) -> str:
    """The plan's header with the placement request, then the per-node commands and files."""
    return describe_plan(plan, full=full, placed=placement_lines(plan), list_code=code_files,
                         reach=lambda login: "a Ray bundle, no ssh", shrink_how=SHRINK_HOW)

"""Backend `ray`: the run's nodes are the bundles of one placement group on a Ray cluster.

mlaunch (foreground) or its detached supervisor is the Ray driver: it places one bundle per
node (strict spread: each on another Ray node), starts one agent actor on each (agent.py)
that runs the node's script under the node relay, with bundle 0's Ray node as the master, and
streams each node's output back as the ssh backend does. The handle is the driving process
(base.py) plus the run's Ray names (its placement group, its agents: connect.py), from which
`stop` reaches whatever is left (stop.py). A lost Ray node is a lost node: the next attempt
places a new group, on another Ray node or, within cluster.min_nodes, on fewer (shrink).

Holds connect (the cluster and the run's names), agent (the actor, shipped by value), executor
(the transport), show (the dry-run view), stop, and lost (the nodes a restart can use).
Standard library only at module level (`mlaunch ps` imports the backends); ray is imported
only where a run reaches the cluster.
"""
from __future__ import annotations

from ..base import Backend, Cancel

BUNDLE_HOST = "bundle{rank}"   # a node's name in the plan, logs and registry


class RayBackend(Backend):
    """A placement group of one bundle per node, an agent per bundle."""

    name = "ray"

    def placement(self, job):
        from ...plan.launch_plan import Placement
        r = job.cluster.ray
        return Placement(nodes=(r.nodes or 0) if r else 0, master="MLAUNCH_MASTER_ADDR",
                         rank_var="", host=BUNDLE_HOST, secrets_in_file=False, guarded=True,
                         one_node_job="node0")

    def show(self, plan, full: bool = False) -> str:
        from .show import describe_ray
        return describe_ray(plan, full)

    def transport(self, plan):
        from .executor import RayExecutor
        return RayExecutor(plan.job.cluster, plan.run_id, [n.login for n in plan.nodes])

    def transport_to(self, logins, ssh):
        raise NotImplementedError("the ray backend reaches a run's nodes through Ray (stop.py)")

    def run_attempt(self, plan, executor, printer, on_started):
        """The ssh backend's session on the placed bundles; the Ray names go to the handle."""
        from ...session.attempt import run_job
        for line in executor.placed():
            printer.say(f"ray: {line}")
        r = plan.job.cluster.ray
        handle = {"ray_address": r.address, "ray_namespace": r.namespace}
        return run_job(plan, executor, printer, connected=True,
                       on_started=lambda: on_started(handle=handle))

    def next_attempt(self, job, plan, executor, result, printer, events):
        """A new placement group for the next attempt: a lost Ray node's bundle goes to another
        node; with too few nodes left, fewer bundles within cluster.min_nodes (shrink)."""
        from .lost import fit
        gone = executor.lost_ips(result)
        executor.close()
        job = fit(job, gone, printer, events)
        plan = plan.replanned(job=job, placement=self.placement(job))
        return job, plan, self.connect(plan)

    def reach_nodes(self, run, force: bool) -> Cancel:
        from .stop import reach
        return reach(run, force)

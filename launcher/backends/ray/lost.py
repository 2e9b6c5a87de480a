"""Before a Ray restart: which Ray nodes the last attempt lost, and how many nodes the next
one can have. Ray picks the nodes, so a lost node's bundle simply goes to another Ray node
when one is free (Ray's own spare); when fewer nodes than asked can hold a bundle and
cluster.min_nodes allows it, the next attempt asks for fewer, grad_accum recomputed to keep
the global batch (runs/shrink.py's arithmetic)."""
from __future__ import annotations

import time

from ...errors import UserError
from ...runs import shrink
from ...spec.ray_rules import bundle
from ...spec.select import node_procs

SETTLE_S = 90.0   # how long Ray may take to declare a lost node dead (its health checks)
PROBE_S = 10.0    # a node that runs a task within this is alive


def fits(want: dict[str, float]) -> int:
    """How many live Ray nodes could each hold one bundle of want (their total resources)."""
    import ray
    return sum(1 for n in ray.nodes() if n.get("Alive") and all(
        n.get("Resources", {}).get(k, 0) >= v for k, v in want.items()))


def lost_ips(result, ips: dict[str, str]) -> list[str]:
    """The Ray node IPs of the last attempt's nodes whose agent was lost (its actor died, or
    Ray stopped answering for it), also where a peer's failure was reported first: a node
    mlaunch tore down reports an exit code, never a lost agent."""
    out = []
    for o in result.nodes:
        if o.exit is not None and o.exit.lost and o.host in ips:
            out.append(ips[o.host])
    return list(dict.fromkeys(out))


def settle(ips: list[str]) -> list[str]:
    """Wait until Ray says whether each node is dead or alive; the dead ones."""
    import ray
    dead, end = [], time.monotonic() + SETTLE_S
    for ip in ips:
        while time.monotonic() < end:
            node = next((n for n in ray.nodes() if n.get("NodeManagerAddress") == ip
                         and n.get("Alive")), None)
            if node is None:
                dead.append(ip)
                break
            if _answers(ray, node["NodeID"]):
                break
    return dead


def _answers(ray, node_id: str) -> bool:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    ref = ray.remote(_ping).options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
        node_id, soft=False)).remote()
    try:
        ray.get(ref, timeout=PROBE_S)
        return True
    except Exception:  # noqa: BLE001  (timed out, or the node died meanwhile)
        ray.cancel(ref, force=True)
        return False


def _ping() -> int:
    return 0


def fit(job, gone: list[str], printer, events):
    """job for the next attempt: as it is while enough Ray nodes can hold a bundle, else with
    fewer nodes (shrink) within cluster.min_nodes; UserError (the run ends) below it."""
    dead = settle(gone)
    for ip in dead:
        printer.say(f"ray: node {ip} is gone from the Ray cluster")
        events.emit("node_excluded", host=ip, reason="Ray node lost")
    want, usable = len(node_procs(job.cluster)), fits(bundle(job.cluster))
    if usable >= want or not shrink.allowed(job):
        return job
    lost = ", ".join(dead) or "none"
    why = f"Ray has {usable} live node(s) that can hold a bundle, of the {want} asked"
    if usable < job.cluster.min_nodes:
        raise UserError(f"cluster.min_nodes: {job.cluster.min_nodes}: {why}; the run ends")
    c = job.cluster
    new = job.model_copy(update={"cluster": c.model_copy(update={
        "ray": c.ray.model_copy(update={"nodes": usable})})})
    return shrink.resized(job, new, lost, why, printer, events)

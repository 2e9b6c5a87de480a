"""Reaching the Ray cluster of cluster.ray, and the names a run's Ray objects carry (its
placement group, its agents), from which `stop` finds them again."""
from __future__ import annotations

from ...errors import Problem


def group_name(run_id: str) -> str:
    """The placement group of a run (one at a time: an attempt's replaces the last's)."""
    return f"mlaunch-{run_id}"


def agent_name(run_id: str, rank: int) -> str:
    """The agent actor of node rank."""
    return f"mlaunch-{run_id}-node{rank}"


def connect(r) -> Problem | None:
    """This process connected to the Ray cluster at r.address (once; later calls reuse it),
    the agent module shipped by value; a Problem naming the address when it cannot be reached."""
    import ray
    from . import agent
    if ray.is_initialized():
        return None
    ray.cloudpickle.register_pickle_by_value(agent)
    address = None if r.address == "auto" else r.address
    try:
        ray.init(address=address or "auto", namespace=r.namespace, logging_level="ERROR",
                 log_to_driver=False, configure_logging=True)
    except Exception as e:  # noqa: BLE001  (one line, whatever Ray raised)
        words = str(e).strip().splitlines()
        return Problem("cluster.ray.address", f"{r.address}: cannot connect to Ray "
                       f"({type(e).__name__}: {words[0][:200] if words else ''}); give the "
                       "head's ray://host:10001 (Ray Client) or host:6379 from a node of it")
    return None

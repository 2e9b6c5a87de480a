"""Reaching the Ray cluster of cluster.ray, and the names a run's Ray objects carry (its
placement group, its agents), from which `stop` finds them again."""
from __future__ import annotations

import contextlib
import signal
import threading

from ...errors import Problem

CLIENT_TRIES = 3   # a Ray Client connection asked this many times


@contextlib.contextmanager
def _own_signals():
    """Keep mlaunch's SIGTERM and SIGINT handlers (stop's and Ctrl-C's teardown, base.py):
    ray.init installs its own, which would end the driver without tearing the run down."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


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
    tries = CLIENT_TRIES if r.address.startswith("ray://") else 1
    for n in range(tries):
        try:
            with _own_signals():
                ray.init(address=r.address, namespace=r.namespace, logging_level="ERROR",
                         log_to_driver=False, configure_logging=True)
            return None
        except ConnectionError as e:
            # A Ray Client's server starts a process per client, which a loaded head may not
            # have ready in time ("Initialization failure from server"): asked again.
            failed = e
        except Exception as e:  # noqa: BLE001  (one line, whatever Ray raised)
            failed = e
            break
    words = str(failed).strip().splitlines()
    return Problem("cluster.ray.address", f"{r.address}: cannot connect to Ray "
                   f"({type(failed).__name__}: {words[0][:200] if words else ''}); give the "
                   "head's ray://host:10001 (Ray Client) or host:6379 from a node of it")

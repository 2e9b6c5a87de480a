"""`mlaunch stop` on Ray: the run's agents killed (each one's session hangs up, and the node's
hang-up guard ends its processes), its placement group removed, then a teardown by process
tag on every live Ray node, which proves nothing of the run is left. Hosts, pidfiles and tags
come from the registry's plans (ssh/sweep.py's recorded), never from the spec."""
from __future__ import annotations

from ... import render
from ..base import Cancel
from ..ssh.sweep import LEFT, recorded
from ...transport.base import TEARDOWN_GRACE
from .connect import agent_name, connect, group_name


def reach(run, force: bool) -> Cancel:
    """End whatever of run is left on the Ray cluster; left per Ray node."""
    plans, tags = recorded(run)
    ray_spec = _spec(run)
    if not plans or ray_spec is None:
        return Cancel(how="no node was started (the registry holds no plan of the run)")
    if problem := connect(ray_spec):
        return Cancel(problems=[str(problem)])
    import ray
    ranks = max(len(p["nodes"]) for p in plans)
    how = [f"killed {n} agent(s)" for n in [_kill_agents(run.id, ranks, ray_spec.namespace)] if n]
    if _remove_group(run.id, ray_spec.namespace):
        how.append(f"removed placement group {group_name(run.id)}")
    pidfiles = sorted({n["pidfile"] for p in plans for n in p["nodes"]})
    script = "\n".join(render.teardown_script(f"MLAUNCH_RUN_ID={tag}", pidfiles, TEARDOWN_GRACE,
                                              force) for tag in tags)
    result = Cancel(how="; ".join(how))
    for ip, code, out in _everywhere(ray, script, TEARDOWN_GRACE * len(tags) + 30):
        counts = [int(n) for n in LEFT.findall(out)]
        if len(counts) != len(tags):
            result.problems.append(f"ray node {ip}: teardown did not finish (exit {code}): "
                                   f"{out.strip()[-200:]}")
        result.left[ip] = sum(counts)
    return result


def _spec(run):
    """The run's cluster.ray block as it was recorded."""
    from ...spec.ray_spec import Ray
    block = (run.spec or {}).get("cluster", {}).get("ray")
    return Ray(**block) if isinstance(block, dict) else None


def _kill_agents(run_id: str, ranks: int, namespace: str) -> int:
    import ray
    killed = 0
    for rank in range(ranks):
        try:
            ray.kill(ray.get_actor(agent_name(run_id, rank), namespace=namespace), no_restart=True)
            killed += 1
        except Exception:  # noqa: BLE001  (no such actor, or dead already: nothing to kill)
            pass
    return killed


def _remove_group(run_id: str, namespace: str) -> bool:
    from ray.util.placement_group import get_placement_group, remove_placement_group
    try:
        remove_placement_group(get_placement_group(group_name(run_id)))
        return True
    except Exception:  # noqa: BLE001  (no such group: removed already)
        return False


def _everywhere(ray, script: str, timeout: float) -> list[tuple[str, int, str]]:
    """(node IP, exit code, output) of script on every live Ray node, one pinned task each."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    from . import agent
    task = ray.remote(agent.run_on_node)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = [task.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
        n["NodeID"], soft=False)).remote(["/bin/sh", "-c", render.bootstrap()],
                                         render.framed(script), timeout) for n in nodes]
    out = []
    for n, ref in zip(nodes, refs):
        try:
            out.append(tuple(ray.get(ref, timeout=timeout + 30)))
        except Exception as e:  # noqa: BLE001
            out.append((n.get("NodeManagerAddress", "?"), 255, f"ray: {type(e).__name__}: {e}"[:300]))
    return out

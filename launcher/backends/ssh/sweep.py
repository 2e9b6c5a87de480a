"""Reaching every node of a registered run directly and ending its processes.

Used by `mlaunch stop` after the supervisor has torn the run down (to prove nothing is
left) and instead of it when the supervisor is lost. The hosts, pidfiles and process tags
come from the plans the registry recorded for the run and each of its attempts (a spare
that took a node's place is in them), never from the spec. Processes are found by the
MLAUNCH_RUN_ID of each attempt in their environment, never by name.
"""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

from ... import render
from ..base import Cancel
from ...transport.base import TEARDOWN_GRACE

LEFT = re.compile(r"mlaunch-teardown: (\d+) left")


def recorded(run) -> tuple[list[dict], list[str]]:
    """The plans the registry holds for run (its latest, then each attempt's) and the process
    tags of every attempt it may have started: those recorded, and those up to max_restarts
    further (a restart starts its nodes before the registry hears of it)."""
    from ...plan.launch_plan import attempt_tag
    from ...record.registry import Registry
    reg = Registry()
    try:
        attempts = reg.attempts(run.id)
        latest = (reg.get(run.id) or run).plan
    finally:
        reg.close()
    plans = [p for p in [latest] + [a.plan for a in attempts] if p]
    limit = max([p["restarts"]["max_restarts"] for p in plans] + [0])
    tags = [a.tag for a in attempts] + [attempt_tag(run.id, n)
                                        for n in range(max(run.attempts, 1) + limit + 1)]
    return plans, list(dict.fromkeys(tags))


def sweep(run, backend, kill_now: bool = False) -> Cancel:
    """TERM, grace, KILL for every attempt's processes on every host run used; what is left."""
    plans, tags = recorded(run)
    if not plans and run.attempts:   # recorded by an mlaunch that kept no plans
        return Cancel(problems=[f"run {run.id} started {run.attempts} attempt(s) but the registry "
                                "holds no plan of it (an older mlaunch recorded it): its hosts are "
                                "unknown here; end its processes on each of its hosts by hand "
                                f"(each carries MLAUNCH_RUN_ID={run.id} in its environment)"])
    if not plans:
        return Cancel(how="no node was started (the registry holds no plan of the run)")
    nodes = {(n["login"], n["pidfile"]) for p in plans for n in p["nodes"]}
    hosts = list(dict.fromkeys(login for login, _ in sorted(nodes)))
    executor = backend.transport_to(hosts, _ssh_settings(plans[0]))
    try:
        problems = executor.connect()
        if problems:
            return Cancel(problems=[str(p) for p in problems])
        pidfiles = sorted({pidfile for _, pidfile in nodes})
        boxes = {h: sorted({n["container_rm"] for p in plans for n in p["nodes"]
                            if n["login"] == h and n.get("container_rm")}) for h in hosts}
        with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
            outs = list(pool.map(lambda h: _host(executor, h, pidfiles, tags, kill_now, boxes[h]),
                                 hosts))
    finally:
        executor.close()
    result = Cancel()
    for host, (code, out) in zip(hosts, outs):
        counts = [int(n) for n in LEFT.findall(out)]
        if len(counts) != len(tags):
            result.problems.append(f"host {host}: teardown did not finish (exit {code}): "
                                   f"{out.strip()[-200:]}")
        result.left[host] = sum(counts)
    return result


def _ssh_settings(plan: dict):
    """How the run reached its hosts (cluster.ssh, as its recorded plan holds it)."""
    from ...spec.cluster_spec import SSH
    return SSH(**plan["ssh"])


def _host(executor, host: str, pidfiles: list[str], tags: list[str],
          kill_now: bool, containers: list[str] = ()) -> tuple[int, str]:
    # Every rank's pidfile: a spare took a lost node's rank (each is signalled only while its
    # leader's environment holds the run's tag: templates/teardown.sh.j2). The containers of
    # every recorded attempt's nodes on this host (cluster.container) go with the last tag's.
    script = "\n".join(render.teardown_script(f"MLAUNCH_RUN_ID={tag}", pidfiles, TEARDOWN_GRACE,
                                              kill_now, containers=list(containers) if i == len(tags) - 1 else None)
                       for i, tag in enumerate(tags))
    return executor.run(host, script, timeout=TEARDOWN_GRACE * len(tags) + 20)

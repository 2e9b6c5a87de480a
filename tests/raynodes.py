"""Helpers for the Ray backend's tests on a real Ray cluster (tests/hostkit/raycluster.py):
a script job spec through `cluster.scheduler: ray`, the run's processes per namespace host by
PID, and what Ray itself still holds of a run (its agents, its placement group)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from .helpers import SCRIPTS, free_port, limit
from .procs import GUARD_PROGRAMS, program_name


def ray_script_job(cluster, tmp_path, script: str, args: list[str], *, nodes: int = 3,
                   nproc: int = 2, **extra) -> dict:
    """A `trainer: script` spec on the Ray cluster: one bundle of one CPU per node."""
    return {"name": "t", "trainer": "script",
            "cluster": {"scheduler": "ray", "gpus_per_node": nproc, "python": sys.executable,
                        "master_port": free_port(),
                        "ray": {"address": cluster.address, "nodes": nodes, "resources": {"CPU": 1}},
                        **extra},
            "script": {"path": os.path.join(SCRIPTS, script), "args": args},
            "output_dir": str(tmp_path / "out")}


def _start(pid: int) -> int | None:
    from launcher.backends.base import proc_start
    return proc_start(pid)


def _tagged(pid: int, run_id: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    mine = f"MLAUNCH_RUN_ID={run_id}".encode()
    return any(e == mine or e.startswith(mine + b"+a") for e in env)


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError):
        return None


def _is_raylet(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].endswith(b"/raylet")
    except OSError:
        return False


def run_procs(cluster, run_id: str) -> dict[str, set[tuple[int, int]]]:
    """Per host, (pid, start time) of every process of the run: those whose environment holds
    the run's tag (any attempt's), and their ancestors up to the raylet (the node shell, the
    relay, the run's agent actor)."""
    out = {}
    for h in cluster.hs:
        pids = h.pids()
        found = set()
        for pid in (p for p in pids if _tagged(p, run_id)):
            while pid in pids and pid not in found and not _is_raylet(pid):
                found.add(pid)
                pid = _parent(pid)
        out[h.name] = {(p, s) for p in found if (s := _start(p)) is not None}
    return out


def run_procs_left(cluster, run_id: str, wait_s: float = 10.0) -> dict[str, set[tuple[int, int]]]:
    """run_procs once mlaunch has returned. A node's hang-up guard (tests/procs.py's
    GUARD_PROGRAMS) ends just after its session closed, so while only those are left they
    get up to wait_s (scaled to the load) to end; anything else is returned at once."""
    deadline = time.monotonic() + limit(wait_s)
    while True:
        left = run_procs(cluster, run_id)
        others = any(program_name(p) not in (None, *GUARD_PROGRAMS) for ps in left.values() for p, _ in ps)
        if others or not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def still_alive(procs: dict[str, set[tuple[int, int]]], wait_s: float = 10.0) -> dict[str, set[int]]:
    """Of procs (run_procs), those still running (the same pid and start time) once mlaunch
    has returned: the agents' Ray workers end when Ray has killed them, and the hang-up guard
    when its session closed, both just after; so they get up to wait_s (scaled to the load)."""
    deadline = time.monotonic() + limit(wait_s)
    while True:
        alive = {name: {p for p, s in ps if _start(p) == s} for name, ps in procs.items()}
        if not any(alive.values()) or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


_STATE = """
import json, sys, ray
run_id, namespace = sys.argv[2], sys.argv[3]
ray.init(address=sys.argv[1], namespace=namespace, logging_level="ERROR", log_to_driver=False)
agents = []
for rank in range(16):
    try:
        ray.get_actor(f"mlaunch-{run_id}-node{rank}", namespace=namespace)
        agents.append(rank)
    except ValueError:
        pass
groups = [g["state"] for g in ray.util.placement_group_table().values()
          if g.get("name") == f"mlaunch-{run_id}"]
alive = sum(1 for n in ray.nodes() if n["Alive"])
print(json.dumps({"agents": agents, "groups": groups, "alive": alive}))
"""


def ray_state(cluster, run_id: str, namespace: str = "mlaunch") -> dict:
    """What Ray holds of run_id: its live agents' ranks, its placement groups' states, and
    the cluster's live node count (asked through the Ray Client, as mlaunch does)."""
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", _STATE, cluster.address, run_id, namespace],
                           capture_output=True, text=True, timeout=limit(120))
        # A loaded head may not have the Ray Client's per-client server ready in time (as
        # launcher/backends/ray/connect.py knows): asked again, like mlaunch does.
        if r.returncode == 0 or "Initialization failure from server" not in r.stderr:
            break
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])

"""Rules of `cluster.scheduler: ray`: the nodes are bundles Ray places, not hosts; and the
one line for a trainer's own Ray mode (LLaMA-Factory's USE_RAY and ray_* keys, ms-swift's
use_ray), which would start a Ray job of its own on every rank.

Each rule returns Problems (field path, what is wrong, the fix), one line each.
"""
from __future__ import annotations

import re

from ..errors import Problem
from .models import Cluster

INSTEAD = ("set cluster.scheduler: ray and cluster.ray: {address: ..., nodes: N} (mlaunch "
           "places one bundle per node and runs torchrun in each)")
# LLaMA-Factory's Ray-mode keys and what each becomes under mlaunch's scheduler: ray.
LF_RAY_KEYS = {
    "use_ray": "cluster.scheduler: ray",
    "ray_num_workers": "cluster.ray.nodes × cluster.gpus_per_node",
    "resources_per_worker": "cluster.ray.resources (per node)",
    "placement_strategy": "nothing (mlaunch spreads the nodes strictly)",
    "ray_init_kwargs": "cluster.ray.address",
    "ray_run_name": "name",
    "ray_storage_path": "output_dir",
    "ray_storage_filesystem": "output_dir on storage every node sees",
}


def check_ray(c: Cluster, ssh_given: bool) -> list[Problem]:
    """A ray block only with scheduler ray; with it, the nodes come from the Ray cluster."""
    if c.scheduler != "ray":
        if c.ray is not None:
            return [Problem("cluster.ray", f"given but cluster.scheduler is {c.scheduler}; set "
                            "`scheduler: ray`, or remove the ray block")]
        return []
    why = "with scheduler ray the nodes are bundles Ray places"
    p: list[Problem] = []
    if c.ray is None or c.ray.nodes is None:
        p.append(Problem("cluster.ray.nodes", "required with scheduler ray: how many nodes (one "
                         "bundle each) to place, e.g. `ray: {address: auto, nodes: 2}`"))
    if c.slurm is not None:
        p.append(Problem("cluster.slurm", "given but cluster.scheduler is ray; remove the slurm block"))
    if c.hosts:
        p.append(Problem("cluster.hosts", f"{why}; remove hosts and set cluster.ray.nodes"))
    if c.master_addr:
        p.append(Problem("cluster.master_addr", f"{why}: the master is bundle 0's node; remove it"))
    if ssh_given:
        p.append(Problem("cluster.ssh", "mlaunch does not SSH to Ray nodes (Ray starts them); "
                         "remove the ssh block"))
    for name in ("include", "exclude", "first_nodes"):
        if getattr(c, name) is not None:
            p.append(Problem(f"cluster.{name}", f"{why}; choose nodes with Ray resources "
                             "(cluster.ray.resources) instead"))
    if c.spare_hosts:
        p.append(Problem("cluster.spare_hosts", "Ray places the nodes: a restart takes any other "
                         "Ray node in a lost one's place by itself; remove spare_hosts"))
    if c.cuda_visible_devices is not None:
        p.append(Problem("cluster.cuda_visible_devices", "Ray gives each bundle its GPUs (its "
                         "CUDA_VISIBLE_DEVICES); remove it, or ask cluster.ray.resources"))
    if c.gpus_per_node is None:
        p.append(Problem("cluster.gpus_per_node", "required: the processes torchrun starts per node"))
    elif isinstance(c.gpus_per_node, list):
        p.append(Problem("cluster.gpus_per_node", f"one count per host needs known hosts ({why}); "
                         "give one count for every node"))
    return p + _check_block(c)


def _check_block(c: Cluster) -> list[Problem]:
    r = c.ray
    if r is None:
        return []
    p: list[Problem] = []
    if not _address_ok(r.address):
        p.append(Problem("cluster.ray.address", f"{r.address!r}: give ray://host:10001, "
                         "host:6379, or auto (a host, and a port from 1 to 65535 where one is given)"))
    for name, amount in (r.resources or {}).items():
        if amount < 0:
            p.append(Problem(f"cluster.ray.resources.{name}", f"{amount}: a bundle asks a "
                             "resource amount of 0 or more"))
    if r.resources and not any(v > 0 for v in r.resources.values()):
        p.append(Problem("cluster.ray.resources", "every amount is 0: a bundle must ask for "
                         "something (Ray refuses empty bundles), e.g. {CPU: 1}"))
    return p


def _address_ok(address: str) -> bool:
    """auto, or [ray://]host[:port] with a host and a port in range: what Ray can dial."""
    if address == "auto":
        return True
    m = re.fullmatch(r"(?:ray://)?(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+)(?::(\d{1,5}))?/?", address)
    return bool(m) and (m[2] is None or 1 <= int(m[2]) <= 65535)


def bundle(c: Cluster) -> dict[str, float]:
    """One node's bundle: cluster.ray.resources, else the node's GPUs and one CPU."""
    if c.ray is not None and c.ray.resources is not None:
        return {k: float(v) for k, v in c.ray.resources.items() if v > 0}
    gpus = c.gpus_per_node if isinstance(c.gpus_per_node, int) else 0
    return {"CPU": 1.0, **({"GPU": float(gpus)} if gpus else {})}


def is_lf_ray_key(key: str) -> bool:
    """A key of LLaMA-Factory's own Ray mode (this version of it or another)."""
    return key in LF_RAY_KEYS or key.startswith("ray_")


def lf_ray_keys(passthrough: dict) -> list[Problem]:
    """LLaMA-Factory's Ray-mode keys: one line naming what to write instead."""
    keys = [k for k in passthrough if is_lf_ray_key(k)]
    if not keys:
        return []
    instead = "; ".join(f"{k} -> {LF_RAY_KEYS.get(k, 'cluster.ray')}" for k in keys)
    return [Problem(f"passthrough.{keys[0]}", f"LLaMA-Factory's own Ray mode would start a Ray "
                    f"job on every rank; {INSTEAD}, and remove {', '.join(keys)} ({instead})")]


SWIFT_USE_RAY = ("ms-swift's own Ray mode would start a Ray job on every rank; " + INSTEAD +
                 ", and remove use_ray")
USE_RAY_ENV = ("LLaMA-Factory would start Ray on every rank instead of training under "
               "mlaunch's torchrun; for a Ray cluster " + INSTEAD)

"""Nodes and their process counts (gpus_per_node: one count, or one per host), and
selecting part of the hosts as `deepspeed -i/-e/--num_nodes` do: cluster.include,
cluster.exclude (`worker-0:0,2@worker-1`) and cluster.first_nodes.

DeepSpeed's rules (deepspeed/launcher/runner.py): include and exclude cannot be combined,
nor either with num_nodes; a named host must exist and a named slot must be one it has;
`host` alone means all its slots; hosts keep the hostfile's order; a node left with no slot
is dropped. The slots a node keeps become its CUDA_VISIBLE_DEVICES.
"""
from __future__ import annotations

from ..errors import Problem
from .hosts import host_addrs, machine_key
from .models import Cluster, JobBase


def node_procs(c: Cluster) -> list[int]:
    """Processes of every node, in rank order (gpus_per_node, one count or one per host)."""
    g = c.gpus_per_node
    n = ((c.slurm.nodes or 0) if c.scheduler == "slurm" and c.slurm else
         (c.ray.nodes or 0) if c.scheduler == "ray" and c.ray else len(c.hosts or []))
    return list(g) if isinstance(g, list) else [g or 0] * n


def procs_of(c: Cluster, rank: int) -> int:
    """Processes of node `rank` (its torchrun --nproc-per-node)."""
    g = c.gpus_per_node
    return g[rank] if isinstance(g, list) else g or 0


def world_size(job: JobBase) -> int:
    """All processes of a job whose cluster validated: Σ over nodes of their process counts.

    0 while gpus_per_node lists a count per host for other hosts than cluster.hosts (or under
    Slurm, which refuses a list): that problem has its own line, and rules sized from this world
    (batch, layout) wait for it."""
    c = job.cluster
    if isinstance(c.gpus_per_node, list) and (c.scheduler in ("slurm", "ray") or
                                              len(c.gpus_per_node) != len(c.hosts or [])):
        return 0
    return sum(node_procs(c))


def world_text(c: Cluster, unit: str = "GPUs") -> str:
    """`4 nodes × 4 GPUs`, `1 node × 1 GPU`, or `3 nodes: 4+1+2 = 7 GPUs` when the counts
    differ (`3 nodes × (4+1+2) GPUs` read as 3 × 7)."""
    procs = node_procs(c)
    nodes = f"{len(procs)} node{'' if len(procs) == 1 else 's'}"
    if len(set(procs)) <= 1:
        n = procs[0] if procs else 0
        return f"{nodes} × {n} {_ONE.get(unit, unit) if n == 1 else unit}"
    return f"{nodes}: {_sum_text(procs)} = {sum(procs)} {unit}"


def world_factor(c: Cluster, unit: str = "GPUs") -> str:
    """The world as the first factor of a product: `4 nodes × 4 GPUs` when every node runs the
    same count, else `7 GPUs (4+1+2 on 3 nodes)`; `3 nodes × (4+1+2) GPUs × 2` would read as 3 × 7 × 2."""
    procs = node_procs(c)
    if len(set(procs)) <= 1:
        return world_text(c, unit)
    return f"{sum(procs)} {unit} ({_sum_text(procs)} on {len(procs)} nodes)"


def _sum_text(procs: list[int]) -> str:
    return "+".join(map(str, procs)) if len(procs) <= 16 else f"{procs[0]}+{procs[1]}+…"


_ONE = {"GPUs": "GPU", "processes": "process"}   # world_text's units, for a count of 1


def select(c: Cluster) -> tuple[dict | None, list[Problem], list[str]]:
    """(fields replacing hosts/gpus_per_node/cuda_visible_devices, problems, dry-run notes)."""
    if c.include is None and c.exclude is None and c.first_nodes is None:
        return None, [], []
    hosts = c.hosts or []
    g = c.gpus_per_node
    if not hosts or g is None or (isinstance(g, list) and len(g) != len(hosts)):
        return None, [], []  # check_cluster names what is missing
    if c.include is not None and c.exclude is not None:
        return None, [Problem("cluster.include", "include and exclude cannot be combined "
                              "(as deepspeed -i/-e); keep one")], []
    if c.first_nodes is not None:
        if c.include is not None or c.exclude is not None:
            return None, [Problem("cluster.first_nodes", "cannot be combined with include/exclude "
                                  "(as deepspeed --num_nodes); keep one")], []
        return _first(c, hosts)
    if c.cuda_visible_devices is not None:
        return None, [Problem("cluster.cuda_visible_devices", "give cuda_visible_devices or "
                              "include/exclude, not both: the slots include/exclude keep become "
                              "each node's CUDA_VISIBLE_DEVICES")], []
    return _filter(c, hosts)


def _first(c: Cluster, hosts: list[str]) -> tuple[dict | None, list[Problem], list[str]]:
    n = c.first_nodes
    if n > len(hosts):
        return None, [Problem("cluster.first_nodes", f"{n} but only {len(hosts)} hosts are listed; "
                              f"use at most {len(hosts)}")], []
    devs = c.cuda_visible_devices
    new = {"hosts": hosts[:n], "first_nodes": None}
    if isinstance(c.gpus_per_node, list):
        new["gpus_per_node"] = _count(c.gpus_per_node[:n])
    if devs and isinstance(devs[0], list):
        new["cuda_visible_devices"] = devs[:n]
    return new, [], [f"first_nodes {n}: {n} of {len(hosts)} hosts ({hosts[0]} … {hosts[n - 1]})"]


def _filter(c: Cluster, hosts: list[str]) -> tuple[dict | None, list[Problem], list[str]]:
    field = "cluster.include" if c.include is not None else "cluster.exclude"
    text = c.include if c.include is not None else c.exclude
    wanted, problems = _parse(text, field)
    ranks: dict[str, list[int]] = {}
    for r, a in enumerate(host_addrs(hosts)):
        ranks.setdefault(machine_key(a.name), []).append(r)
    procs = node_procs(c)
    for name, slots in wanted.items():
        where = ranks.get(machine_key(name))
        if not where:
            problems.append(Problem(field, f"host {name!r} is not in cluster.hosts/hostfile"))
        elif len(where) > 1:
            problems.append(Problem(field, f"{name} is listed {len(where)} times (nodes "
                                    f"{', '.join(map(str, where))}); include/exclude pick hosts by "
                                    "name, so list each host once"))
        elif any(s >= procs[where[0]] for s in slots):
            bad = next(s for s in slots if s >= procs[where[0]])
            problems.append(Problem(field, f"{name} has slots 0-{procs[where[0]] - 1}; there is no "
                                    f"slot {bad}"))
    if problems:
        return None, problems, []
    keep = _kept(c.include is not None, wanted, ranks, procs)
    if not keep:
        return None, [Problem(field, f"{text!r} leaves no host; keep at least one slot")], []
    new = {"hosts": [hosts[r] for r, _ in keep], "gpus_per_node": _count([len(s) for _, s in keep]),
           "cuda_visible_devices": [s for _, s in keep], "include": None, "exclude": None}
    what = "include" if c.include is not None else "exclude"
    return new, [], [f"{what} {text!r}: {len(keep)} of {len(hosts)} hosts, "
                     f"{sum(len(s) for _, s in keep)} slots; kept slots become CUDA_VISIBLE_DEVICES"]


def _kept(include: bool, wanted: dict[str, list[int]], ranks: dict[str, list[int]],
          procs: list[int]) -> list[tuple[int, list[int]]]:
    """(rank, kept slots) of every node that keeps any, in host order."""
    by_rank = {ranks[machine_key(n)][0]: s for n, s in wanted.items()}
    out = []
    for r, count in enumerate(procs):
        named = by_rank.get(r)
        if include:
            slots = (named or list(range(count))) if named is not None else []
        else:
            slots = [] if named == [] else [s for s in range(count) if s not in (named or [])]
        if slots:
            out.append((r, slots))
    return out


def _parse(text: str, field: str) -> tuple[dict[str, list[int]], list[Problem]]:
    """`NAME[:SLOT[,SLOT...]][@...]` -> {name: sorted slots ([] = the whole host)}."""
    out: dict[str, list[int]] = {}
    for part in text.split("@"):
        name, colon, slots = part.strip().partition(":")
        items = [s.strip() for s in slots.split(",")] if colon else []
        if not name or any(not s.isdigit() for s in items):
            return {}, [Problem(field, f"{part!r} in {text!r}: expected NAME or NAME:SLOT,SLOT "
                                "(hosts joined by @, e.g. worker-0:0,2@worker-1)")]
        prev = out.get(name)
        # A host named whole anywhere stays whole; slots of repeated mentions add up.
        out[name] = [] if prev == [] or not items else sorted(set((prev or []) + [int(s) for s in items]))
    return out, []


def _count(counts: list[int]) -> int | list[int]:
    """One number when every node runs the same count, else one per node."""
    return counts[0] if counts and all(x == counts[0] for x in counts) else counts


def auto_batch(b) -> tuple[int | None, int | None]:
    """(per_device, grad_accum) as given; None where mlaunch chooses or derives. An omitted
    grad_accum is global / (world × per_device) when both are given, else 1 (its default)."""
    pd = b.per_device if isinstance(b.per_device, int) else None
    given = "grad_accum" in b.model_fields_set or (pd is not None and b.global_ is None)
    ga = b.grad_accum if isinstance(b.grad_accum, int) and given else None
    return pd, ga

"""The rules of cluster.spare_hosts and cluster.min_nodes (issue 29: spares, elastic shrink).

A spare takes a lost node's place before a restart with that node's rank, process count and
devices, so everything that makes one node differ from another is refused beside spares.
A shrink (min_nodes below the node count) drops nodes, so every node must run the same count
too, and the checkpoint must load at another data-parallel size (check_shrink).
check_cluster calls check_spares; check_job calls check_shrink.
"""
from __future__ import annotations

from ..errors import Problem
from .hosts import parse_host
from .models import Cluster, JobBase
from .select import node_procs

# A ZeRO checkpoint holds one optimizer shard per rank; at another data-parallel size mlaunch
# resumes it through DeepSpeed's universal checkpoint (runs/universal.py): verified with
# LLaMA-Factory 0.9.5, transformers 4.57, DeepSpeed 0.19.8 on CPU/gloo: ZeRO-2 4 -> 3 ranks
# (the spec's stage), ZeRO-3 3 -> 2 ranks (the user's own ds_config file); ms-swift 4.6 ZeRO-3
# (its `zero3` file) 3 -> 2 ranks.
# Everything else stays refused, each with its reason.
ZERO_UNVERIFIED = ("a DeepSpeed checkpoint holds one optimizer shard per rank; mlaunch resumes it "
                   "at another data-parallel size through DeepSpeed's universal checkpoint "
                   "(ds_to_universal, then checkpoint.load_universal), verified for LLaMA-Factory and ms-swift "
                   "with ZeRO-2 and ZeRO-3 (ZeRO-1 shares ZeRO-2's optimizer), CPU offload with LLaMA-Factory, "
                   "from the spec's stage or your own ds_config, over ssh and under Slurm, not {what}; set "
                   "cluster.min_nodes to the node count ({n}), give cluster.spare_hosts instead, "
                   "or use {fix}")
MEGATRON_SHRINK = ("Megatron-SWIFT's distributed checkpoint is laid out for its tp/pp/dp grid "
                   "and mlaunch does not re-shard it; set cluster.min_nodes to the node count "
                   "({n}) or give cluster.spare_hosts instead")


def shrinks(c: Cluster) -> bool:
    """Whether cluster.min_nodes lets a restart run on fewer nodes than cluster.hosts."""
    return c.min_nodes is not None and c.min_nodes < len(node_procs(c))


def check_shrink(job: JobBase) -> list[Problem]:
    """A job that may shrink must resume at a smaller data-parallel size."""
    c = job.cluster
    if not shrinks(c):
        return []
    n, why = len(node_procs(c)), None
    if getattr(job, "megatron", None):
        why = MEGATRON_SHRINK
    elif getattr(job, "deepspeed", None):
        why = _zero_unverified(job)
    if why is None:
        return []
    # replace, not format: the reason may quote a path with braces in it (deepspeed.config)
    return [Problem("cluster.min_nodes", f"{c.min_nodes}: " + why.replace("{n}", str(n)))]


def _zero_unverified(job: JobBase) -> str | None:
    """The refusal of a ZeRO shrink outside the verified form (LLaMA-Factory or ms-swift without
    Megatron, ZeRO-1/2/3 from the spec's stage, a named file or the user's own, offload to the
    CPU or none), or None."""
    what, fix = None, "deepspeed.stage 1, 2 or 3 with offload to cpu or none"
    if job.trainer not in ("llamafactory", "swift"):
        what, fix = f"trainer {job.trainer}", "LLaMA-Factory or ms-swift, or LoRA/DDP without deepspeed"
    else:
        what = _zero_form(job)
    return ZERO_UNVERIFIED.replace("{what}", what).replace("{fix}", fix) if what else None


def _zero_form(job: JobBase) -> str | None:
    """What keeps this DeepSpeed config from a verified shrink: a stage other than 1-3, or
    offload to NVMe, read from the resolved config (the spec's stage, or the user's own file).
    CPU offload keeps the checkpoint's layout (DeepSpeed saves the fp32 partitions the same
    way), and was verified; NVMe offload needs the async-io op and a swap folder per node,
    which no test here has."""
    from .deepspeed import build_for
    built = build_for(job)
    if built.problems:            # check_job reports those; a shrink rule adds nothing
        return None
    src = f" in {job.deepspeed.config}" if job.deepspeed.config else ""
    zero = built.config.get("zero_optimization", {})
    if built.stage() not in (1, 2, 3):
        return f"ZeRO stage {built.stage()}{src}"
    nvme = [k for k in ("offload_optimizer", "offload_param")
            if (zero.get(k) or {}).get("device") == "nvme"]
    return f"with {' and '.join(nvme)} to nvme{src}" if nvme else None


def check_spares(c: Cluster) -> list[Problem]:
    """min_nodes within the node count, and spares that can stand in for any node."""
    p = _check_min_nodes(c)
    if not c.spare_hosts:
        return p
    if c.scheduler == "slurm":
        return p + [Problem("cluster.spare_hosts", "Slurm picks the nodes, so there are no "
                            "spares under Slurm (a restart excludes the nodes that failed by "
                            "itself); remove spare_hosts, or use scheduler: ssh with hosts")]
    p += _check_spare_forms(c)
    if isinstance(c.gpus_per_node, list):
        src = " (the hostfile's slots= differ between hosts)" if c.hostfile else ""
        p.append(Problem("cluster.gpus_per_node", f"{list(c.gpus_per_node)}{src}: a spare may take "
                         "any node's place, so every node must run the same count; give one "
                         "count, or remove spare_hosts"))
    devs = c.cuda_visible_devices
    if devs and isinstance(devs[0], list):
        p.append(Problem("cluster.cuda_visible_devices", f"one list per node ({devs}) with "
                         "spare_hosts: a spare may take any node's place; give one list for "
                         "every node, or remove spare_hosts"))
    return p


def _check_min_nodes(c: Cluster) -> list[Problem]:
    """min_nodes ≤ the node count; below it, one process count for every node."""
    if c.min_nodes is None:
        return []
    n = len(node_procs(c))
    if not n:
        return []   # no hosts: that problem has its own line
    if c.min_nodes > n:
        of = {"slurm": "cluster.slurm.nodes", "ray": "cluster.ray.nodes"}.get(c.scheduler, "cluster.hosts")
        return [Problem("cluster.min_nodes", f"{c.min_nodes} is more than the {n} nodes of "
                        f"{of}; give at most {n}, or leave it out")]
    if c.min_nodes < n and isinstance(c.gpus_per_node, list):
        return [Problem("cluster.gpus_per_node", f"{list(c.gpus_per_node)}: a shrink "
                        f"(cluster.min_nodes {c.min_nodes}) may drop any node, so every node must "
                        "run the same count; give one count, or set min_nodes to the node count")]
    return []


def _check_spare_forms(c: Cluster) -> list[Problem]:
    """Each spare parses, agrees with cluster.ssh, and is neither a node nor another spare."""
    port = c.ssh.port
    nodes = {}
    for i, h in enumerate(c.hosts or []):
        a = parse_host(h)
        if not isinstance(a, str):
            nodes.setdefault(a.key(port), i)
    p: list[Problem] = []
    seen: dict = {}
    for i, h in enumerate(c.spare_hosts):
        where, a = f"cluster.spare_hosts[{i}]", parse_host(h)
        if isinstance(a, str):
            p.append(Problem(where, a))
            continue
        if a.user and c.ssh.user and a.user != c.ssh.user:
            p.append(Problem(where, f"{h!r} says user {a.user} but cluster.ssh.user is "
                             f"{c.ssh.user}; remove one"))
        key = a.key(port)
        if key in nodes:
            p.append(Problem(where, f"{h!r} is already cluster.hosts[{nodes[key]}]; a spare must "
                             "be a machine the job does not use; remove it or name another"))
        elif key in seen:
            p.append(Problem(where, f"{h!r} is also cluster.spare_hosts[{seen[key]}]; list each "
                             "spare once"))
        seen.setdefault(key, i)
    return p

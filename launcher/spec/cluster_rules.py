"""The cluster block's cross-field rules: hosts, processes per node, GPUs, the rendezvous
address, env names, the interpreter, and where a relative output_dir lands on many machines.

Part of the spec rules (launcher/spec/check.py's check_job calls check_cluster and
check_output_dir, and re-exports these names).
"""
from __future__ import annotations

import re

from ..errors import Problem
from .env_refs import check_env_refs
from .hosts import LOOPBACK, check_hosts, host_addrs, is_address, machine_key
from .models import Cluster, JobBase
from .ray_rules import USE_RAY_ENV
from .select import node_procs, procs_of

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Variables the launcher sets per node. A user value would silently break the rendezvous:
# seed 003's "give each node its own MASTER_PORT" fix for "Address in use" is wrong,
# because every node must dial the one port the master listens on.
OWNED_ENV = {
    "MASTER_ADDR": "cluster.master_addr", "MASTER_PORT": "cluster.master_port",
    "NODE_RANK": "the node order in cluster.hosts", "RANK": "torchrun", "LOCAL_RANK": "torchrun",
    "WORLD_SIZE": "torchrun", "NNODES": "cluster.hosts", "NPROC_PER_NODE": "cluster.gpus_per_node",
    "CUDA_VISIBLE_DEVICES": "cluster.cuda_visible_devices",
}
RENDEZVOUS_WHY = "every node must share one master address and port"
# mlaunch's own variables on the nodes: teardown, `stop` and the live view find a run's
# processes by them, so a user value is replaced (and was once silently dropped).
MLAUNCH_ENV = ("MLAUNCH_RUN_ID", "MLAUNCH_NODE_ID", "MLAUNCH_NODE_RANK", "MLAUNCH_MASTER_ADDR",
               "MLAUNCH_IN_PROCESS", "MLAUNCH_LIVE", "MLAUNCH_STAGED_FILE")
# Variables that make a trainer's own launcher start processes or a cluster beside mlaunch's
# torchrun (llamafactory-cli and `swift sft` read them): each rank would launch again.
LAUNCHER_ENV = {
    "USE_RAY": USE_RAY_ENV,
    "RDZV_ID": "it switches llamafactory-cli to an elastic torchrun of its own; mlaunch runs one "
               "static rendezvous (use max_restarts for fault tolerance)",
    "MIN_NNODES": "elastic node counts belong to llamafactory-cli's own torchrun; mlaunch starts "
                  "exactly the nodes in cluster.hosts",
    "MAX_NNODES": "elastic node counts belong to llamafactory-cli's own torchrun; mlaunch starts "
                  "exactly the nodes in cluster.hosts",
    "FORCE_TORCHRUN": "it makes llamafactory-cli start a torchrun of its own; mlaunch already "
                      "runs torchrun on every node",
}


def check_cluster(c: Cluster) -> list[Problem]:
    """Hosts, processes per node, rendezvous address, devices, env names and the interpreter."""
    from .ray_rules import check_ray
    from .slurm_rules import check_scheduler
    from .spare_rules import check_spares
    from .container_rules import check_container
    ssh_given = "ssh" in c.model_fields_set
    p: list[Problem] = check_scheduler(c, ssh_given) + check_ray(c, ssh_given)
    if c.scheduler == "ray":
        if c.container is not None:
            p.append(Problem("cluster.container", "a container under scheduler ray is not supported: "
                             "run the Ray nodes themselves in the image (KubeRay: the pod's image) "
                             "and remove cluster.container"))
        return p + _check_env(c) + check_env_refs(c.env) + (check_spares(c) if not c.spare_hosts else [])
    p += check_spares(c) + check_container(c)
    if c.scheduler == "slurm":
        return p + _check_env(c) + check_env_refs(c.env)
    if not c.hosts:
        p.append(Problem("cluster.hosts", "no hosts: give `hosts: [...]` or `hostfile: FILE`"))
        return p
    ssh = c.ssh
    p += check_hosts(c.hosts, ssh.user, ssh.port if "port" in ssh.model_fields_set else None)
    if c.gpus_per_node is None:
        p.append(Problem("cluster.gpus_per_node", "required (or give slots=N in the hostfile)"))
    elif isinstance(c.gpus_per_node, list) and len(c.gpus_per_node) != len(c.hosts):
        p.append(Problem("cluster.gpus_per_node", f"{len(c.gpus_per_node)} counts for "
                         f"{len(c.hosts)} hosts; give one count, or one per host in host order"))
    p += _check_devices(c)
    p += _check_master(c)
    return p + _check_env(c) + check_env_refs(c.env)


def _check_env(c: Cluster) -> list[Problem]:
    """The remote interpreter and the env names, whatever starts the nodes."""
    p: list[Problem] = []
    if c.python and c.venv:
        p.append(Problem("cluster.venv", "give either python or venv, not both"))
    for name in c.env:
        if not ENV_NAME.fullmatch(name):
            p.append(Problem(f"cluster.env.{name}", "not a valid environment variable name: use "
                             "letters, digits and _, not starting with a digit (e.g. MY_VAR)"))
        elif name in MLAUNCH_ENV:
            p.append(Problem(f"cluster.env.{name}", "mlaunch's own: it sets it on every node "
                             "to find and tear down the run's processes; remove it (--run-id "
                             "names the run)"))
        elif name in OWNED_ENV:
            why = ("mlaunch's torchrun sets it per node; a trainer's own launcher reading it would "
                   "start torchrun again" if name in ("NNODES", "NODE_RANK", "NPROC_PER_NODE")
                   else RENDEZVOUS_WHY)
            p.append(Problem(f"cluster.env.{name}", f"set by mlaunch from {OWNED_ENV[name]}; "
                             f"remove it ({why})"))
        elif name in LAUNCHER_ENV:
            p.append(Problem(f"cluster.env.{name}", f"{LAUNCHER_ENV[name]}; remove it"))
    return p


def machines(c: Cluster) -> int:
    """Distinct machines among the nodes (a host name, case ignored, and its SSH port)."""
    return len({a.key(c.ssh.port) for a in host_addrs(c.hosts or [])})


def check_output_dir(job: JobBase) -> list[Problem]:
    """A relative output_dir resolves against each machine's own directory: refuse it there,
    unless an absolute cluster.workdir (where every node cd's) makes it one path everywhere."""
    out, c = job.output_dir, job.cluster
    n = machines(c) if out and not out.startswith("/") and c.hosts else 0
    if n < 2 or (c.workdir or "").startswith("/"):
        return []
    base = c.workdir or "the ssh user's home"
    return [Problem("output_dir", f"{out!r} is relative: each of the {n} machines would "
                    f"resolve it against its own working directory ({base}), scattering the "
                    "checkpoints; give an absolute path on storage every node sees, e.g. "
                    f"/mnt/shared/{out}, or an absolute cluster.workdir it resolves in")]


def output_dir_note(job: JobBase) -> str | None:
    """Where a relative output_dir lands on a multi-machine run (in cluster.workdir)."""
    out, c = job.output_dir, job.cluster
    if not out or out.startswith("/") or not c.workdir or machines(c) < 2:
        return None
    return (f"output_dir {out!r} is relative: every node resolves it in cluster.workdir, as "
            f"{c.workdir.rstrip('/')}/{out}; that directory must be shared storage")


def node_path_notes(job: JobBase) -> list[str]:
    """One note per relative path the nodes use, saying where it resolves. The rule: a path
    is relative to where it is opened; the nodes open theirs in cluster.workdir."""
    c, where = job.cluster, job.cluster.workdir
    fields = [("cluster.python", c.python if c.python and "/" in c.python else None),
              ("cluster.venv", c.venv), ("cluster.workdir", c.workdir),
              ("dataset_dir", getattr(job, "dataset_dir", None)),
              ("script.path", getattr(getattr(job, "script", None), "path", None))]
    model = getattr(job, "model", None)
    if isinstance(model, str) and model.startswith("."):   # ./m, ../m, .cache/m: no hub id starts with a dot
        fields.append(("model", model))
    if job.output_dir and not output_dir_note(job):
        fields.append(("output_dir", job.output_dir))
    base = (f"cluster.workdir ({where})" if where and where.startswith("/") else
            "the directory each node starts in: the one you run mlaunch from for local nodes, "
            "the SSH user's home on other machines (cluster.workdir chooses one)")
    return [f"{name} {value!r} is relative: the nodes resolve it in {base}"
            for name, value in fields if value and not value.startswith(("/", "~"))
            and not (name == "cluster.workdir")] + (
        [f"cluster.workdir {where!r} is relative: each node resolves it in the directory it starts in"]
        if where and not where.startswith(("/", "~")) else [])


def node_devices(c: Cluster, rank: int) -> list[int] | None:
    """The GPU indices node `rank` uses (its CUDA_VISIBLE_DEVICES), None for all of them."""
    devs = c.cuda_visible_devices
    if devs is None or not devs:
        return list(devs) if devs is not None else None
    return list(devs[rank]) if isinstance(devs[0], list) else list(devs)


def _check_devices(c: Cluster) -> list[Problem]:
    """One device per process, and a host listed twice only when its nodes own disjoint GPUs."""
    p: list[Problem] = []
    devs, hosts = c.cuda_visible_devices, c.hosts or []
    per_node = bool(devs) and isinstance(devs[0], list)
    if per_node and len(devs) != len(hosts):
        return [Problem("cluster.cuda_visible_devices",
                        f"{len(devs)} device lists for {len(hosts)} hosts; give one list per node")]
    procs = node_procs(c) if c.gpus_per_node is not None else None
    if devs is not None and not per_node and procs and len(set(procs)) > 1:
        return [Problem("cluster.cuda_visible_devices", "one list for nodes that run different "
                        "numbers of processes; give one list per node, e.g. [[0, 1], [0]]")]
    for rank in range(len(hosts) if per_node else 1) if devs is not None else ():
        mine = node_devices(c, rank)
        where = f"cluster.cuda_visible_devices[{rank}]" if per_node else "cluster.cuda_visible_devices"
        want = procs[rank] if procs and rank < len(procs) else None
        if any(d < 0 for d in mine):
            p.append(Problem(where, f"{mine}: GPU indices start at 0 (see nvidia-smi -L)"))
        elif len(set(mine)) != len(mine):
            p.append(Problem(where, f"{mine} lists a GPU twice; give each process its own GPU"))
        elif want is not None and len(mine) != want:
            p.append(Problem(where, f"{len(mine)} devices listed but gpus_per_node is "
                             f"{want}; list exactly one device per process"))
    return p + _check_shared_hosts(c, per_node)


def _split_example(c: Cluster, ranks: list[int]) -> str:
    """An example of cuda_visible_devices for these nodes of one host, each with its own
    gpus_per_node GPUs, as YAML: the first two, then `...`; a count per node where they
    differ; none while a count is missing (that has its own line)."""
    counts = [procs_of(c, r) if isinstance(c.gpus_per_node, int) or
              (isinstance(c.gpus_per_node, list) and r < len(c.gpus_per_node)) else 0 for r in ranks]
    if not all(isinstance(n, int) and n > 0 for n in counts):
        return ""
    lists, start = [], 0
    for n in counts[:2]:
        lists.append("[" + ", ".join(map(str, range(start, start + n))) + "]")
        start += n
    each = f"gpus_per_node ({counts[0]})" if len(set(counts)) == 1 else "its gpus_per_node"
    return f" of {each} GPUs, e.g. [" + ", ".join(lists + (["..."] if len(counts) > 2 else [])) + "]"


def _check_shared_hosts(c: Cluster, per_node: bool) -> list[Problem]:
    """Nodes on one machine (same name, case ignored, same SSH port) need disjoint GPUs."""
    hosts = c.hosts or []
    ranks_of: dict[tuple[str, int], list[int]] = {}
    for r, a in enumerate(host_addrs(hosts)):  # one pass: 10,000 hosts cost 10,000 steps
        ranks_of.setdefault(a.key(c.ssh.port), []).append(r)
    p: list[Problem] = []
    for key in sorted(k for k, ranks in ranks_of.items() if len(ranks) > 1):
        ranks = ranks_of[key]
        host = " / ".join(dict.fromkeys(hosts[r] for r in ranks))
        if not per_node:
            p.append(Problem("cluster.hosts", f"{host} listed {len(ranks)} times: nodes on one host "
                             "need their own GPUs; give cuda_visible_devices one list per node"
                             f"{_split_example(c, ranks)}, or list the host once"))
            continue
        seen: dict[int, int] = {}
        for r in ranks:
            for d in node_devices(c, r):
                if d in seen:
                    p.append(Problem(f"cluster.cuda_visible_devices[{r}]",
                                     f"GPU {d} on {host} is also node {seen[d]}'s; nodes on one "
                                     "host must use disjoint GPUs"))
                seen.setdefault(d, r)
    return p


def _check_master(c: Cluster) -> list[Problem]:
    """Node rank 0 hosts the rendezvous store, so master_addr must be it and be reachable."""
    m = c.master_addr
    if m is None:
        return []
    if not is_address(m):
        return [Problem("cluster.master_addr", f"{m!r} is not a host name or IP address; give "
                        "node 0's address only (no user@ or :port; the port is cluster.master_port)")]
    names = [a.name for a in host_addrs(c.hosts or [])]
    key = machine_key(m)
    later = next((i for i, n in enumerate(names[1:], 1) if machine_key(n) == key), None)
    if machine_key(names[0]) != key and later is not None:
        return [Problem("cluster.master_addr",
                        f"{m} is hosts[{later}], but node rank 0 ({names[0]}) runs the "
                        "rendezvous; list the master first or omit master_addr")]
    remote = [n for n in names if not LOOPBACK.fullmatch(n)]
    if LOOPBACK.fullmatch(m) and remote:
        return [Problem("cluster.master_addr",
                        f"{m} is loopback, which {remote[0]} cannot reach; use the master's "
                        "cluster-network address")]
    return []

"""Rules of `cluster.scheduler: slurm`: the nodes come from the allocation, not from hosts.

Each rule returns Problems (field path, what is wrong, the fix), one line each.
"""
from __future__ import annotations

import re

from ..errors import Problem
from .models import Cluster

# Slurm's --time forms (sbatch(1)): minutes, minutes:seconds, hours:minutes:seconds,
# days-hours, days-hours:minutes, days-hours:minutes:seconds; plus its unlimited words.
TIME_RE = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|"
                     r"\d+-\d+:\d{1,2}:\d{1,2}|UNLIMITED|INFINITE|unlimited|infinite)$")
OPTION_RE = re.compile(r"^[a-z][a-z0-9-]+$")
VALUE_RE = re.compile(r"^[^\s\"'\\]+$")   # one word: #SBATCH lines are not shell-quoted

# sbatch options mlaunch writes itself, each with why a user value would break the run.
OWNED_SBATCH = {
    "nodes": "set cluster.slurm.nodes",
    "ntasks": "mlaunch runs one task per node (torchrun starts the processes)",
    "ntasks-per-node": "mlaunch runs one task per node (torchrun starts gpus_per_node processes)",
    "output": "mlaunch writes the logs to output_dir/logs/<run-id>/, where `mlaunch logs` reads them",
    "error": "mlaunch writes the logs to output_dir/logs/<run-id>/, where `mlaunch logs` reads them",
    "input": "the job reads nothing from stdin",
    "job-name": "mlaunch names the job after the spec's name",
    "open-mode": "mlaunch appends to the per-attempt log files",
    "parsable": "mlaunch passes --parsable on the sbatch command line to read the job id",
    "requeue": "mlaunch restarts by submitting a new job that resumes from the latest complete "
               "checkpoint; set max_restarts",
    "no-requeue": "mlaunch sets it: restarts are new jobs (max_restarts)",
    "array": "one mlaunch run is one job; submit the spec once per variant",
    "wrap": "mlaunch renders the batch script",
    "chdir": "set cluster.workdir (every rank cds there)",
    "partition": "set cluster.slurm.partition",
    "account": "set cluster.slurm.account",
    "qos": "set cluster.slurm.qos",
    "time": "set cluster.slurm.time",
    "constraint": "set cluster.slurm.constraint",
    "exclusive": "set cluster.slurm.exclusive",
    "reservation": "set cluster.slurm.reservation",
    "wait": "mlaunch follows the job itself (foreground) or returns at once (-d)",
    "kill-on-invalid-dep": "mlaunch submits no dependent jobs",
    "dependency": "mlaunch chains restarts itself",
}


def check_scheduler(c: Cluster, ssh_given: bool) -> list[Problem]:
    """The scheduler's own fields: a slurm block only with scheduler slurm, and its rules."""
    if c.scheduler != "slurm":
        if c.slurm is not None and c.scheduler != "ray":   # ray's rules say it for ray
            return [Problem("cluster.slurm", "given but cluster.scheduler is ssh; set "
                            "`scheduler: slurm`, or remove the slurm block")]
        return []
    p: list[Problem] = []
    why = "with scheduler slurm the nodes come from the allocation"
    if c.hosts:
        p.append(Problem("cluster.hosts", f"{why}; remove hosts and set cluster.slurm.nodes"))
    if c.master_addr:
        p.append(Problem("cluster.master_addr", f"{why}: the master is its first node; remove it"))
    if c.cuda_visible_devices and isinstance(c.cuda_visible_devices[0], list):
        p.append(Problem("cluster.cuda_visible_devices", f"per-node lists need known nodes ({why}); "
                         "give one list for every node, or leave GPUs to Slurm (extra_sbatch gres)"))
    if ssh_given:
        p.append(Problem("cluster.ssh", "mlaunch does not SSH to Slurm nodes (srun starts them); "
                         "remove the ssh block"))
    for name in ("include", "exclude", "first_nodes"):
        if getattr(c, name) is not None:
            p.append(Problem(f"cluster.{name}", f"{why}; choose nodes with cluster.slurm "
                             "(nodes, constraint, extra_sbatch nodelist/exclude) instead"))
    if c.gpus_per_node is None:
        p.append(Problem("cluster.gpus_per_node", "required: the processes torchrun starts per node"))
    elif isinstance(c.gpus_per_node, list):
        p.append(Problem("cluster.gpus_per_node", f"one count per host needs known hosts ({why}); "
                         "give one count for every node"))
    if not c.shared_dir:
        p.append(Problem("cluster.shared_dir", "required with scheduler slurm: the batch script, "
                         "rendered files and logs go there, read by every node and by mlaunch"))
    elif not VALUE_RE.fullmatch(c.shared_dir):
        p.append(Problem("cluster.shared_dir", f"{c.shared_dir!r}: no spaces or quotes (it goes "
                         "into #SBATCH lines)"))
    return p + check_slurm_block(c)


def check_slurm_block(c: Cluster) -> list[Problem]:
    """nodes, time and every other option of the slurm block."""
    s = c.slurm
    if s is None or s.nodes is None:
        return [Problem("cluster.slurm.nodes", "required with scheduler slurm: how many nodes to "
                        "allocate, e.g. `slurm: {nodes: 2}`")]
    p: list[Problem] = []
    if s.time is not None and not TIME_RE.fullmatch(s.time):
        p.append(Problem("cluster.slurm.time", f"{s.time!r} is not a Slurm time; use MM, MM:SS, "
                         "HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, e.g. 2-00:00:00"))
    for name in ("partition", "account", "qos", "constraint", "reservation"):
        value = getattr(s, name)
        if value is not None and not VALUE_RE.fullmatch(value):
            p.append(Problem(f"cluster.slurm.{name}", f"{value!r}: one word, no spaces or quotes"))
    for key, value in s.extra_sbatch.items():
        p += _extra(key, value)
    return p + _gpu_requests(c)


def _gpus_asked(key: str, value) -> int | None:
    """GPUs per node that one extra_sbatch option asks for, or None when it asks for none.

    gres `gpu:8`, `gpu:a100:8`, `gpu:8,shard:2` (a bare `gpu` is one); gpus-per-node and
    gpus-per-task `8` or `a100:8` (one task per node); gpus is the job's total (per node below).
    """
    text = str(value)
    if key == "gres":
        gpu = next((g for g in text.split(",") if g.split(":")[0] == "gpu"), None)
        if gpu is None:
            return None
        last = gpu.split("(")[0].split(":")[-1]
        return int(last) if last.isdigit() else 1
    if key in ("gpus-per-node", "gpus-per-task", "gpus"):
        last = text.split(",")[0].split(":")[-1]
        return int(last) if last.isdigit() else None
    return None


def _gpu_requests(c: Cluster) -> list[Problem]:
    """GPUs asked per node must be the processes torchrun starts there: more leaves GPUs idle
    that the allocation still charges, fewer puts two ranks on one GPU (NCCL refuses that)."""
    want, nodes = c.gpus_per_node, c.slurm.nodes
    if not isinstance(want, int):
        return []
    p: list[Problem] = []
    for key, value in c.slurm.extra_sbatch.items():
        asked = _gpus_asked(key.lstrip("-"), value)
        if asked is None:
            continue
        per_node = asked / nodes if key.lstrip("-") == "gpus" else asked
        if per_node != want:
            total = f" ({asked} over {nodes} nodes)" if key.lstrip("-") == "gpus" else ""
            p.append(Problem(f"cluster.slurm.extra_sbatch.{key}", (
                f"{value!r} asks for {per_node:g} GPUs per node{total} but cluster.gpus_per_node "
                f"is {want} (the processes torchrun starts per node); make them agree, e.g. "
                f"`{key}: {_asking(key.lstrip('-'), value, want * (nodes if key.lstrip('-') == 'gpus' else 1))}`"
                f" or `gpus_per_node: {per_node:g}`")))
    return p


def _asking(key: str, value, n: int) -> str:
    """value with its GPU count replaced by n: `gpu:a100:8` -> `gpu:a100:4`."""
    if key == "gres":
        parts = str(value).split(",")
        i = next(i for i, g in enumerate(parts) if g.split(":")[0] == "gpu")
        head = parts[i].split("(")[0].split(":")
        head = head[:-1] if head[-1].isdigit() else head
        parts[i] = ":".join(head + [str(n)])
        return ",".join(parts)
    head = str(value).split(":")
    return ":".join(head[:-1] + [str(n)])


def _extra(key: str, value) -> list[Problem]:
    where = f"cluster.slurm.extra_sbatch.{key}"
    name = key.lstrip("-")
    if name in OWNED_SBATCH:
        return [Problem(where, f"mlaunch owns --{name}: {OWNED_SBATCH[name]}")]
    if not OPTION_RE.fullmatch(name):
        return [Problem(where, "not a long sbatch option name (e.g. gres, mem, cpus-per-task); "
                        "short forms like -N are not accepted")]
    if value is False:
        return [Problem(where, "false: give true for a flag option, or remove the key")]
    if value is not True and not VALUE_RE.fullmatch(str(value)):
        return [Problem(where, f"{value!r}: one word, no spaces or quotes")]
    return []

"""Where batch planning's inputs come from: the spec, this machine, and preflight's facts.

The one place that reads the model's config.json for planning (locally; node 0's copy
arrives through preflight) and picks the GPU memory figure, saying where each came from.
"""
from __future__ import annotations

import os

from .batch import MemoryInputs
from ..spec import JobBase, model_config

DRY_RUN = "a dry run asks no node"
PLAN = "`mlaunch plan` asks no node; submit reads node 0's copy in preflight"
NO_PREFLIGHT = "no preflight ran to read node 0's copy (--no-preflight, or a scheduler's nodes)"


def inputs(job: JobBase, preflight: dict | None = None, unasked: str = DRY_RUN) -> MemoryInputs:
    """MemoryInputs for job; preflight: Report.memory (None for a dry run, `mlaunch plan` or
    --no-preflight); unasked: why no node was asked, for the message when that left a gap."""
    gpu, gpu_src = gpu_memory(job, preflight)
    cfg, cfg_src = config(job, preflight, unasked)
    return MemoryInputs(gpu_gib=gpu, gpu_source=gpu_src, model_config=cfg, config_source=cfg_src)


def gpu_memory(job: JobBase, preflight: dict | None) -> tuple[float | None, str]:
    """(GiB per GPU, where from): the smaller of cluster.gpu_memory_gb and nvidia-smi's figure."""
    spec = job.cluster.gpu_memory_gb
    seen = (preflight or {}).get("gpu_mib")
    smi = seen / 1024 if seen else None
    if smi and spec:
        return min(smi, spec), (f"the smaller of nvidia-smi's {smi:.1f} GiB (smallest GPU the job "
                                f"uses) and cluster.gpu_memory_gb {spec:g}")
    if smi:
        return smi, "nvidia-smi on every node: the smallest GPU the job uses"
    if spec:
        return spec, "cluster.gpu_memory_gb"
    if preflight is not None:
        return None, "preflight saw no GPU (nvidia-smi absent or failed)"
    return None, "not known without preflight"


def config(job: JobBase, preflight: dict | None, unasked: str = DRY_RUN) -> tuple[dict | None, str]:
    """(config.json, where from): the one node 0 read in preflight (what the nodes load), else
    this machine's copy, a relative path taken where the nodes take it (cluster.workdir)."""
    model = getattr(job, "model", None)
    if not isinstance(model, str):
        return None, "no model"
    path = os.path.join(os.path.expanduser(model), "config.json")
    remote = (preflight or {}).get("model_config")
    if isinstance(remote, dict):
        return remote, f"{path}, read on node 0"
    workdir = job.cluster.workdir
    if workdir and workdir.startswith("/") and not os.path.isabs(os.path.expanduser(model)):
        model = os.path.join(workdir, model)   # as the nodes open it (`cd` there first)
        path = os.path.join(model, "config.json")
    cfg = model_config(model)
    if cfg is not None:
        return cfg, f"{path}, read here"
    if preflight is None:
        return None, f"{path} is not on this machine and {unasked}"
    return None, f"{path} is readable neither here nor on node 0"

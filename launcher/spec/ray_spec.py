"""The `cluster.ray` block: which Ray cluster runs the job and what each node's bundle holds
(cluster.scheduler: ray; its rules are in ray_rules.py, its backend launcher/backends/ray/)."""
from __future__ import annotations

from pydantic import Field

from .strict import Strict


class Ray(Strict):
    """The Ray cluster mlaunch places the job on: one bundle per node, strictly spread."""

    address: str = Field("auto", description=(
        "ray://head:10001 (a Ray Client, e.g. a KubeRay head service), head:6379 from a "
        "machine of the cluster, or auto: the cluster this machine is part of"))
    nodes: int | None = Field(None, ge=1, le=100000, description=(
        "nodes to place (one bundle each, every bundle on another Ray node)"))
    resources: dict[str, float] | None = Field(None, description=(
        "each node's bundle: Ray resources (default {GPU: gpus_per_node, CPU: 1}); the "
        "bundle's GPUs are the node's CUDA_VISIBLE_DEVICES"))
    placement_timeout_s: float = Field(120.0, gt=0, le=86400, description=(
        "how long to wait for Ray to place every bundle before refusing the run"))
    namespace: str = Field("mlaunch", description="the Ray namespace of the run's actors")

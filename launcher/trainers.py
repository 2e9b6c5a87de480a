"""The trainer seam: what each trainer adds to the plan (files to write, what torchrun starts).

A new trainer (ms-swift) adds a spec model in spec/models.py and one class here.
"""
from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Protocol

from . import render
from .spec import JobBase, LlamaFactoryJob, ScriptJob, world


@dataclass(frozen=True)
class RenderedFile:
    """A file the nodes read, at its path on the nodes."""

    path: str
    content: str


@dataclass(frozen=True)
class RunContext:
    """What a trainer needs to know about this launch."""

    run_id: str
    run_dir: str
    resume_from: str | None = None
    overwrite: bool = False


class Trainer(Protocol):
    resumable: bool  # writes checkpoints that `--resume` and restarts can continue from

    def files(self, job: JobBase, run: RunContext) -> list[RenderedFile]:
        """Config files every node must be able to read."""

    def entry(self, job: JobBase, run: RunContext) -> list[str]:
        """torchrun's program and its arguments (after torchrun's own options)."""

    def discovery_args(self, job: JobBase) -> list[str]:
        """Arguments for launcher/checkpoints.py beyond output_dir (DeepSpeed layout)."""


class LlamaFactory:
    """LLaMA-Factory via its launcher module, fed one rendered YAML (+ ds_config.json)."""

    resumable = True

    def discovery_args(self, job: LlamaFactoryJob) -> list[str]:
        return deepspeed_discovery_args(job)

    def files(self, job: LlamaFactoryJob, run: RunContext) -> list[RenderedFile]:
        ds_path = posixpath.join(run.run_dir, "ds_config.json") if job.deepspeed else None
        out = [RenderedFile(self._yaml_path(run), render.llamafactory_yaml(
            job, run.run_id, ds_path, run.resume_from, run.overwrite))]
        if ds_path:
            nodes, gpus = world(job)
            out.append(RenderedFile(ds_path, render.ds_config(job, global_batch(job, nodes, gpus))))
        return out

    def entry(self, job: LlamaFactoryJob, run: RunContext) -> list[str]:
        return ["-m", "llamafactory.launcher", self._yaml_path(run)]

    @staticmethod
    def _yaml_path(run: RunContext) -> str:
        return posixpath.join(run.run_dir, "llamafactory.yaml")


class Script:
    """Any script or module, exactly as a user would hand it to torchrun."""

    resumable = False

    def discovery_args(self, job: ScriptJob) -> list[str]:
        return []

    def files(self, job: ScriptJob, run: RunContext) -> list[RenderedFile]:
        return []

    def entry(self, job: ScriptJob, run: RunContext) -> list[str]:
        s = job.script
        head = ["-m", s.module] if s.module else [s.path]
        return [*head, *s.args]


def deepspeed_discovery_args(job) -> list[str]:
    """With DeepSpeed a checkpoint is complete only with one optimizer shard per rank."""
    if not getattr(job, "deepspeed", None):
        return []
    nodes, gpus = world(job)
    return ["--deepspeed", "--dp-size", str(nodes * gpus)]


def global_batch(job: LlamaFactoryJob, nodes: int, gpus: int) -> int:
    """nodes x gpus_per_node x per_device x grad_accum (validation already matched `global`)."""
    return nodes * gpus * job.batch.per_device * job.batch.grad_accum


TRAINERS: dict[str, Trainer] = {"llamafactory": LlamaFactory(), "script": Script()}

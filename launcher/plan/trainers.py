"""The trainer seam: what each trainer adds to the plan (files to write, what torchrun starts).

A new trainer adds a spec model in spec/models.py and one class here (ms-swift: Swift).
"""
from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass
from typing import Protocol

from . import defaults
from .. import render
from ..spec import JobBase, LlamaFactoryJob, ScriptJob, SwiftJob, model_config, world_size
from ..spec.deepspeed import build_for
from ..spec.lf_rules import not_resumable as lf_not_resumable
from ..spec.swift_rules import (MEGATRON_SCHEDULERS, config_int, not_resumable,
                                rendered_passthrough, swift_notes)


@dataclass(frozen=True)
class RenderedFile:
    """A file the nodes read, at its path on the nodes."""

    path: str
    content: str
    note: str | None = None   # shown above the file in a dry run, never written into it


@dataclass(frozen=True)
class RunContext:
    """What a trainer needs to know about this launch."""

    run_id: str
    run_dir: str
    resume_from: str | None = None
    overwrite: bool | str | None = False  # why overwrite_output_dir (submit._overwrite_why)
    transformers: str | None = None   # the nodes' version, when preflight probed it
    universal: bool = False   # resume_from holds DeepSpeed's universal checkpoint (runs/universal.py)


class Trainer(Protocol):
    resumable: bool  # writes checkpoints that `--resume` and restarts can continue from
    env: dict[str, str]  # defaults for every rank (cluster.env overrides them)
    # A world of one may run entry() with plain python, no torchrun (cluster.torchrun auto).
    in_process: bool

    def files(self, job: JobBase, run: RunContext) -> list[RenderedFile]:
        """Config files every node must be able to read."""

    def entry(self, job: JobBase, run: RunContext) -> list[str]:
        """torchrun's program and its arguments (after torchrun's own options)."""

    def discovery_args(self, job: JobBase) -> list[str]:
        """Arguments for launcher/nodeprog/checkpoints.py beyond output_dir (DeepSpeed layout)."""

    def saves_in_output_dir(self, job: JobBase) -> bool:
        """Whether the trainer saves checkpoint-N straight into output_dir (so into a folder an
        older save may have left there)."""


class LlamaFactory:
    """LLaMA-Factory via its launcher module, fed one rendered YAML (+ ds_config.json)."""

    resumable = True
    # What llamafactory-cli (launcher.py, OPTIM_TORCH on by default) sets for every rank
    # before its own torchrun; mlaunch starts the launcher module directly, so it sets them.
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1"}
    # llamafactory-cli runs one device in-process (no process group, no NCCL buffers);
    # DeepSpeed keeps torchrun: a single-process engine wants the launcher's environment.
    in_process = True

    def discovery_args(self, job: LlamaFactoryJob) -> list[str]:
        return deepspeed_discovery_args(job)

    def saves_in_output_dir(self, job: LlamaFactoryJob) -> bool:
        """checkpoint-N folders go straight into output_dir (runs/outputdir.py clear_way)."""
        return True

    def not_resumable(self, job: LlamaFactoryJob) -> str | None:
        """Why no checkpoint of this job can be resumed (submit refuses --resume then)."""
        return lf_not_resumable(job)

    def files(self, job: LlamaFactoryJob, run: RunContext) -> list[RenderedFile]:
        ds_path = posixpath.join(run.run_dir, "ds_config.json") if job.deepspeed else None
        out = [RenderedFile(self._yaml_path(run), render.llamafactory_yaml(
            job, run.run_id, ds_path, run.resume_from, run.overwrite,
            warmup=warmup_arg(job.training, run.transformers)))]
        if ds_path:
            out.append(ds_file(job, ds_path, run.universal))
            out.append(RenderedFile(self._entry_path(run), render.llamafactory_entry()))
        return out

    def entry(self, job: LlamaFactoryJob, run: RunContext) -> list[str]:
        # Under DeepSpeed, mlaunch's entry script runs llamafactory.launcher after removing
        # empty optimizer parameter groups (templates/llamafactory_entry.py.j2 says why).
        if job.deepspeed:
            return [self._entry_path(run), self._yaml_path(run)]
        return ["-m", "llamafactory.launcher", self._yaml_path(run)]

    @staticmethod
    def _entry_path(run: RunContext) -> str:
        return posixpath.join(run.run_dir, "llamafactory_entry.py")

    @staticmethod
    def _yaml_path(run: RunContext) -> str:
        return posixpath.join(run.run_dir, "llamafactory.yaml")


class Script:
    """Any script or module, exactly as a user would hand it to torchrun."""

    resumable = False
    env: dict[str, str] = {}
    in_process = False   # a user's script may read RANK or init a process group from env://

    def discovery_args(self, job: ScriptJob) -> list[str]:
        return []

    def saves_in_output_dir(self, job: ScriptJob) -> bool:
        """Its checkpoints are the script's own business: mlaunch never moves them."""
        return False

    def files(self, job: ScriptJob, run: RunContext) -> list[RenderedFile]:
        return []

    def entry(self, job: ScriptJob, run: RunContext) -> list[str]:
        s = job.script
        head = ["-m", s.module] if s.module else [s.path]
        return [*head, *s.args]


class Swift:
    """ms-swift 4.x, its stage's entry module started directly by mlaunch's torchrun.

    `swift sft|pt|rlhf` / `megatron sft|pt|rlhf` would re-launch themselves under torchrun
    from NNODES, NODE_RANK, ... in the environment; mlaunch owns that command line, so the
    modules they exec are started directly: swift.cli.<stage> (HF Trainer) or
    swift.cli._megatron.<stage>. The arguments come from templates/swift_args.j2, one per
    line; fields the spec leaves out take ms-swift's defaults (launcher/plan/defaults.py). Unlike
    LLaMA-Factory, ms-swift declares warmup_ratio itself and maps it onto any transformers.
    """

    resumable = True
    env: dict[str, str] = {}
    in_process = False   # not tested without torchrun here

    def discovery_args(self, job: SwiftJob) -> list[str]:
        return ["--megatron"] if job.megatron else deepspeed_discovery_args(job)

    def saves_in_output_dir(self, job: SwiftJob) -> bool:
        """Whether checkpoint-N folders go straight into output_dir, where a save may land in an
        older one: only with add_version off (ms-swift otherwise makes a new v<M>-<time> folder
        for every run, a resume included)."""
        pt = job.passthrough
        return pt.get("add_version") in (False, "false", "False") or pt.get("no_add_version") in (True, "true", "True")

    def files(self, job: SwiftJob, run: RunContext) -> list[RenderedFile]:
        if not job.deepspeed or job.megatron:
            return []
        out = [ds_file(job, self._ds_path(run), run.universal)]
        if run.universal:
            out.append(RenderedFile(self._entry_path(run), render.swift_entry()))
        return out

    def entry(self, job: SwiftJob, run: RunContext) -> list[str]:
        module = ("swift.cli._megatron." if job.megatron else "swift.cli.") + job.stage
        # An attempt that loads a universal checkpoint runs the module through mlaunch's entry,
        # which gives each optimizer state its own step after the load (templates/swift_entry.py.j2).
        head = [self._entry_path(run), module] if run.universal and job.deepspeed else ["-m", module]
        return [*head, *self.args(job, run)]

    @staticmethod
    def _entry_path(run: RunContext) -> str:
        return posixpath.join(run.run_dir, "swift_entry.py")

    def not_resumable(self, job: SwiftJob) -> str | None:
        """Why no checkpoint of this job can be resumed (submit refuses --resume then)."""
        return not_resumable(job)

    def notes(self, job: SwiftJob) -> list[str]:
        """Dry-run lines: ms-swift defaults in use, and what swift does with accepted no-ops."""
        return [f"default {line}" for line in defaults.defaults_in_use(job)] + swift_notes(job)

    def args(self, job: SwiftJob, run: RunContext) -> list[str]:
        """The rendered argument lines, each one argv element."""
        ft = job.finetuning
        d = {"lora_alpha": defaults.value(job, "finetuning.lora_alpha"),
             "lora_dropout": defaults.value(job, "finetuning.lora_dropout"),
             "logging_steps": defaults.value(job, "training.logging_steps"),
             "max_length": job.max_length,
             "recompute": defaults.recompute(job) if job.megatron else None}
        text = render.render(
            "swift_args.j2", job=job, ft=ft, tr=job.training, resume_from=run.resume_from, d=d,
            ds_path=self._ds_path(run) if job.deepspeed and not job.megatron else None,
            lora_targets=_names(ft.lora_target), freeze_layers=_freeze_layers(job),
            freeze_modules=[m for m in _names(ft.freeze_trainable_modules) if m != "all"],
            global_size=global_batch(job) // _model_parallel(job),
            decay_style=MEGATRON_SCHEDULERS.get(job.training.lr_scheduler),
            passthrough=rendered_passthrough(job))
        return [line for line in text.split("\n") if line]

    @staticmethod
    def _ds_path(run: RunContext) -> str:
        return posixpath.join(run.run_dir, "ds_config.json")


@dataclass(frozen=True)
class Warmup:
    """The warmup argument as the nodes' transformers reads it (templates/ explains `why`)."""

    key: str                          # warmup_steps or warmup_ratio
    value: int | float
    why: str | None = None            # "of_max_steps", "unprobed" or "ratio_as_steps"
    transformers: str | None = None   # the nodes' version, when it decided the key


def warmup_arg(tr, transformers: str | None) -> Warmup | None:
    """warmup_ratio / warmup_steps in the form the installed transformers accepts.

    TrainingArguments declares warmup_ratio up to transformers 5.14 (deprecated from 5.0,
    whose warning wrongly announces removal in 5.2) and not from 5.15 on, where the parser
    rejects it; every 5.x reads a warmup_steps below 1 as a ratio, 4.x does not (its
    warmup_steps is an int). With max_steps the ratio becomes the step count all versions
    compute from it (ceil), so the key is the same everywhere; with epochs the nodes'
    version decides, which preflight reports before launch.
    """
    if tr.warmup_steps is not None:
        return Warmup("warmup_steps", tr.warmup_steps)
    if tr.warmup_ratio is None:
        return None
    if tr.max_steps:
        return Warmup("warmup_steps", math.ceil(tr.warmup_ratio * tr.max_steps), "of_max_steps")
    if transformers is None:
        return Warmup("warmup_ratio", tr.warmup_ratio, "unprobed")
    if _release(transformers) >= NO_WARMUP_RATIO:
        return Warmup("warmup_steps", tr.warmup_ratio, "ratio_as_steps", transformers)
    return Warmup("warmup_ratio", tr.warmup_ratio)


NO_WARMUP_RATIO = (5, 15)   # the first transformers release without TrainingArguments.warmup_ratio


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as 5.14.1 or 5.15.0.dev0."""
    parts = [int(p) if p.isdigit() else 0 for p in (version.split(".") + ["0"])[:2]]
    return parts[0], parts[1]


def _names(value: str | list[str]) -> list[str]:
    """A list, or LLaMA-Factory's comma-separated string, as a list of names."""
    items = value if isinstance(value, list) else value.split(",")
    return [i.strip() for i in items if i.strip()]


def _freeze_layers(job: SwiftJob) -> list[int]:
    """Indices of the trainable layers of a freeze job (LLaMA-Factory's meaning of the count)."""
    n = job.finetuning.freeze_trainable_layers
    if job.finetuning.type != "freeze" or n == 0:
        return []
    if n < 0:
        return list(range(-n))
    total = config_int(model_config(job.model), "num_hidden_layers") or n
    return list(range(max(total - n, 0), total))


def _model_parallel(job) -> int:
    """tp x pp x cp: the ranks that share one data-parallel replica (Megatron's dp divisor)."""
    m = getattr(job, "megatron", None)
    return m.tp * m.pp * m.cp if m else 1


def deepspeed_discovery_args(job) -> list[str]:
    """With DeepSpeed a checkpoint is complete only with one optimizer shard per rank."""
    if not getattr(job, "deepspeed", None):
        return []
    return ["--deepspeed", "--dp-size", str(world_size(job))]


def ds_file(job, path: str, universal: bool = False) -> RenderedFile:
    """The resolved ds_config.json, with where each value came from as its dry-run note;
    universal: the attempt resumes DeepSpeed's universal checkpoint (checkpoint.load_universal)."""
    built = build_for(job)
    if built.problems:  # validation reports these; a plan is never built from such a job
        raise ValueError("; ".join(map(str, built.problems)))
    note = "where each value comes from (not part of the file):\n" + built.note()
    config = built.config
    if universal:
        # merged: a user's own checkpoint keys (tag_validation, ...) stay as they are
        config = {**config, "checkpoint": {**config.get("checkpoint", {}), "load_universal": True}}
        note += ("\ncheckpoint.load_universal: mlaunch (the checkpoint was saved at another "
                 "data-parallel size and converted by ds_to_universal)")
    return RenderedFile(path, render.ds_config(config), note)


def global_batch(job: LlamaFactoryJob) -> int:
    """All processes (Σ per node) x per_device x grad_accum (validation matched `global`)."""
    return world_size(job) * job.batch.per_device * job.batch.grad_accum


TRAINERS: dict[str, Trainer] = {"llamafactory": LlamaFactory(), "swift": Swift(), "script": Script()}

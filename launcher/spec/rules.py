"""Cross-field rules that pydantic's per-field types cannot express.

Each rule returns Problems (field path + what is wrong + how to fix), so that a
spec with several mistakes reports them all at once.
"""
from __future__ import annotations

import json
import os
import re

from ..errors import Problem
from .models import Cluster, JobBase, LlamaFactoryJob, ScriptJob, SwiftJob

LOOPBACK = re.compile(r"^(localhost|127\.\d+\.\d+\.\d+|::1)$")
HOST_RE = re.compile(r"^[A-Za-z0-9_.:@\[\]-]+$")
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

# LLaMA-Factory keys that mlaunch renders from the spec, with the field that owns each.
LLAMAFACTORY_OWNED = {
    "model_name_or_path": "model", "template": "template", "dataset": "dataset",
    "dataset_dir": "dataset_dir", "cutoff_len": "cutoff_len", "stage": "stage",
    "do_train": "stage", "finetuning_type": "finetuning.type", "lora_rank": "finetuning.lora_rank",
    "lora_alpha": "finetuning.lora_alpha", "lora_dropout": "finetuning.lora_dropout",
    "lora_target": "finetuning.lora_target",
    "freeze_trainable_layers": "finetuning.freeze_trainable_layers",
    "freeze_trainable_modules": "finetuning.freeze_trainable_modules",
    "quantization_bit": "finetuning.quantization_bit",
    "per_device_train_batch_size": "batch.per_device",
    "gradient_accumulation_steps": "batch.grad_accum", "bf16": "precision", "fp16": "precision",
    "deepspeed": "deepspeed", "output_dir": "output_dir", "overwrite_output_dir": "--overwrite",
    "resume_from_checkpoint": "--resume", "learning_rate": "training.learning_rate",
    "num_train_epochs": "training.epochs", "max_steps": "training.max_steps",
    "lr_scheduler_type": "training.lr_scheduler", "warmup_ratio": "training.warmup_ratio",
    "warmup_steps": "training.warmup_steps", "save_steps": "training.save_steps",
    "logging_steps": "training.logging_steps", "max_grad_norm": "training.max_grad_norm",
    "disable_gradient_checkpointing": "training.gradient_checkpointing", "seed": "training.seed",
    "ddp_timeout": "mlaunch (a generous default)", "report_to": "mlaunch",
}


def check_job(job: JobBase) -> list[Problem]:
    """All cross-field problems of a validated job, in field order."""
    problems = check_cluster(job.cluster)
    if isinstance(job, LlamaFactoryJob):
        problems += check_batch(job) + check_finetuning(job) + check_deepspeed(job)
        problems += check_training(job) + check_passthrough(job)
    elif isinstance(job, SwiftJob):
        problems += check_swift(job)
    elif isinstance(job, ScriptJob):
        problems += check_script(job)
    return problems


def check_cluster(c: Cluster) -> list[Problem]:
    """Hosts, rendezvous address, devices, env names and the remote interpreter."""
    p: list[Problem] = []
    if not c.hosts:
        p.append(Problem("cluster.hosts", "no hosts: give `hosts: [...]` or `hostfile: FILE`"))
        return p
    for i, h in enumerate(c.hosts):
        if not HOST_RE.match(h):
            p.append(Problem(f"cluster.hosts[{i}]", f"{h!r} is not a host name or address"))
    dupes = sorted({h for h in c.hosts if c.hosts.count(h) > 1})
    if dupes:
        p.append(Problem("cluster.hosts", f"{', '.join(dupes)} listed twice; each node is one host"))
    if c.gpus_per_node is None:
        p.append(Problem("cluster.gpus_per_node", "required (or give slots=N in the hostfile)"))
    if c.cuda_visible_devices is not None and c.gpus_per_node is not None:
        if len(c.cuda_visible_devices) != c.gpus_per_node:
            p.append(Problem("cluster.cuda_visible_devices",
                             f"{len(c.cuda_visible_devices)} devices listed but gpus_per_node is "
                             f"{c.gpus_per_node}; list exactly one device per process"))
    p += _check_master(c)
    if c.python and c.venv:
        p.append(Problem("cluster.venv", "give either python or venv, not both"))
    for name in c.env:
        if not ENV_NAME.match(name):
            p.append(Problem(f"cluster.env.{name}", "not a valid environment variable name"))
        elif name in OWNED_ENV:
            p.append(Problem(f"cluster.env.{name}", f"set by mlaunch from {OWNED_ENV[name]}; "
                             "remove it (every node must share one master address and port)"))
    return p


def _check_master(c: Cluster) -> list[Problem]:
    """Node rank 0 hosts the rendezvous store, so master_addr must be it and be reachable."""
    hosts = c.hosts or []
    m = c.master_addr
    if m is None:
        return []
    if m in hosts[1:]:
        return [Problem("cluster.master_addr",
                        f"{m} is hosts[{hosts.index(m)}], but node rank 0 ({hosts[0]}) runs the "
                        "rendezvous; list the master first or omit master_addr")]
    remote = [h for h in hosts if not LOOPBACK.match(h)]
    if LOOPBACK.match(m) and remote:
        return [Problem("cluster.master_addr",
                        f"{m} is loopback, which {remote[0]} cannot reach; use the master's "
                        "cluster-network address")]
    return []


def world(job: JobBase) -> tuple[int, int]:
    """(nodes, processes per node) of a job whose cluster validated."""
    return len(job.cluster.hosts or []), job.cluster.gpus_per_node or 0


def check_batch(job: LlamaFactoryJob) -> list[Problem]:
    """global = nodes x gpus_per_node x per_device x grad_accum, checked before any launch."""
    b = job.batch
    nodes, gpus = world(job)
    if b.global_ is None or not nodes or not gpus:
        return []
    want = nodes * gpus * b.per_device * b.grad_accum
    if b.global_ == want:
        return []
    return [Problem("batch.global",
                    f"{b.global_} ≠ {nodes} nodes × {gpus} GPUs × {b.per_device} per device × "
                    f"{b.grad_accum} accumulation = {want}; set global to {want}, change "
                    "per_device/grad_accum, or omit global")]


def check_finetuning(job: LlamaFactoryJob) -> list[Problem]:
    """Knobs of one method set while another method is chosen are mistakes, not no-ops."""
    f = job.finetuning
    p: list[Problem] = []
    groups = {"lora": ("lora_rank", "lora_alpha", "lora_dropout", "lora_target", "quantization_bit"),
              "freeze": ("freeze_trainable_layers", "freeze_trainable_modules")}
    for method, names in groups.items():
        for name in sorted(set(names) & f.model_fields_set):
            if f.type != method:
                p.append(Problem(f"finetuning.{name}",
                                 f"only applies to type {method}, but type is {f.type}; remove it"))
    if f.quantization_bit and job.deepspeed and job.deepspeed.stage == 3:
        p.append(Problem("finetuning.quantization_bit",
                         "QLoRA cannot be combined with ZeRO-3; use deepspeed stage 0-2 or no quantization"))
    return p


def check_deepspeed(job: LlamaFactoryJob) -> list[Problem]:
    """DeepSpeed's own rules: optimizer offload needs ZeRO >= 1, parameter offload needs ZeRO-3.

    Offload is optional at every stage: ZeRO-2 without offload is valid and the fastest
    ZeRO-2 (seed 000's claim that ZeRO-2 must offload to CPU is wrong).
    """
    ds = job.deepspeed
    if ds is None:
        return []
    p: list[Problem] = []
    if ds.offload_optimizer != "none" and ds.stage < 1:
        p.append(Problem("deepspeed.offload_optimizer",
                         f"{ds.offload_optimizer} offload needs ZeRO stage 1, 2 or 3 (stage is 0)"))
    if ds.offload_param != "none" and ds.stage != 3:
        p.append(Problem("deepspeed.offload_param",
                         f"parameter offload exists only in ZeRO-3 (stage is {ds.stage}); "
                         "use offload_optimizer, or stage 3"))
    if "nvme" in (ds.offload_optimizer, ds.offload_param) and not ds.nvme_path:
        p.append(Problem("deepspeed.nvme_path", "required when offloading to nvme"))
    return p


def check_training(job: LlamaFactoryJob) -> list[Problem]:
    """Exactly one length (epochs or max_steps) and at most one warmup form."""
    t = job.training
    p: list[Problem] = []
    if (t.epochs is None) == (t.max_steps is None):
        p.append(Problem("training", "give exactly one of epochs or max_steps"
                         + (" (max_steps would silently win)" if t.epochs else "")))
    if t.warmup_ratio is not None and t.warmup_steps is not None:
        p.append(Problem("training.warmup_steps", "give warmup_ratio or warmup_steps, not both"))
    return p


# accelerate's CPU mode skips DeepSpeed's communication setup; ZeRO-3's zero.Init then
# reads a world size of 1 and fails with "train_batch_size 4 != 2*1*1". CPU hosts don't
# need the flag: without a GPU, accelerate already runs on CPU over gloo.
USE_CPU_WHY = ("not needed on CPU hosts (accelerate picks the CPU and gloo by itself); it "
               "leaves DeepSpeed's communication uninitialised, so ZeRO-3 counts 1 process and "
               "fails with 'train_batch_size N != micro*1*accum'; remove it")


def check_passthrough(job: LlamaFactoryJob) -> list[Problem]:
    """Extra LLaMA-Factory keys may not override what mlaunch renders from the spec."""
    p: list[Problem] = []
    if job.cluster.env.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        p.append(Problem("cluster.env.ACCELERATE_USE_CPU", USE_CPU_WHY))
    for key in job.passthrough:
        owner = LLAMAFACTORY_OWNED.get(key)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", key):
            p.append(Problem(f"passthrough.{key}", "not a LLaMA-Factory argument name"))
        elif key == "use_cpu":
            p.append(Problem("passthrough.use_cpu", USE_CPU_WHY))
        elif key == "deepspeed":
            p.append(Problem("passthrough.deepspeed",
                             "mlaunch renders the DeepSpeed config; use `deepspeed: {stage: N}`. "
                             "For plain DDP leave deepspeed out entirely: passing --deepspeed "
                             "(as seed 003's DDP example does) runs DeepSpeed, not DDP"))
        elif owner:
            p.append(Problem(f"passthrough.{key}", f"mlaunch owns this key; set {owner} instead"))
    return p


def check_script(job: ScriptJob) -> list[Problem]:
    """A script job names exactly one of a file or a module."""
    s = job.script
    if (s.path is None) == (s.module is None):
        return [Problem("script", "give exactly one of path (a .py file) or module (python -m)")]
    return []


# ms-swift arguments that mlaunch renders from the spec (HF-Trainer mode and Megatron-SWIFT
# mode), with the field that owns each. A passthrough key may not collide with these.
SWIFT_OWNED = {
    "model": "model", "model_type": "model_type", "template": "template", "dataset": "dataset",
    "max_length": "max_length", "tuner_type": "finetuning.type", "train_type": "finetuning.type",
    "lora_rank": "finetuning.lora_rank", "lora_alpha": "finetuning.lora_alpha",
    "lora_dropout": "finetuning.lora_dropout", "target_modules": "finetuning.lora_target",
    "quant_method": "finetuning.quantization_bit", "quant_bits": "finetuning.quantization_bit",
    "freeze_parameters_ratio": "finetuning.freeze_trainable_layers",
    "trainable_parameters_regex": "finetuning.freeze_trainable_layers/freeze_trainable_modules",
    "per_device_train_batch_size": "batch.per_device",
    "gradient_accumulation_steps": "batch.grad_accum", "micro_batch_size": "batch.per_device",
    "global_batch_size": "batch.global", "torch_dtype": "precision", "bf16": "precision",
    "fp16": "precision", "deepspeed": "deepspeed", "output_dir": "output_dir",
    "check_model": "mlaunch (false for local models)",
    "resume_from_checkpoint": "--resume", "mcore_model": "--resume", "mcore_adapter": "--resume",
    "finetune": "--resume", "learning_rate": "training.learning_rate", "lr": "training.learning_rate",
    "num_train_epochs": "training.epochs", "max_steps": "training.max_steps",
    "train_iters": "training.max_steps", "lr_scheduler_type": "training.lr_scheduler",
    "lr_decay_style": "training.lr_scheduler", "warmup_ratio": "training.warmup_ratio",
    "lr_warmup_fraction": "training.warmup_ratio", "warmup_steps": "training.warmup_steps",
    "lr_warmup_iters": "training.warmup_steps", "save_steps": "training.save_steps",
    "logging_steps": "training.logging_steps", "max_grad_norm": "training.max_grad_norm",
    "clip_grad": "training.max_grad_norm", "gradient_checkpointing": "training.gradient_checkpointing",
    "recompute_granularity": "training.gradient_checkpointing",
    "recompute_method": "training.gradient_checkpointing",
    "recompute_num_layers": "training.gradient_checkpointing", "seed": "training.seed",
    "tensor_model_parallel_size": "megatron.tp", "pipeline_model_parallel_size": "megatron.pp",
    "sequence_parallel": "megatron.sequence_parallel",
}

# Megatron's lr_decay_style for each spec scheduler it can express.
MEGATRON_SCHEDULERS = {"constant": "constant", "constant_with_warmup": "constant",
                       "linear": "linear", "cosine": "cosine",
                       "inverse_sqrt": "inverse-square-root", "warmup_stable_decay": "WSD"}

DDP_NOT_DEEPSPEED = ("mlaunch renders the DeepSpeed config; use `deepspeed: {stage: N}`. For plain "
                     "DDP leave deepspeed out entirely: passing --deepspeed (as seed 003's DDP "
                     "example does with `--deepspeed zero2`) runs DeepSpeed ZeRO, not DDP")


def model_config(model: str) -> dict | None:
    """<model>/config.json when the model is a directory readable here, else None."""
    try:
        with open(os.path.join(os.path.expanduser(model), "config.json"), encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


def config_int(cfg: dict | None, key: str) -> int | None:
    """An integer field of a HF config, also looked up in text_config (multimodal models)."""
    for c in (cfg or {}, (cfg or {}).get("text_config") or {}):
        v = c.get(key) if isinstance(c, dict) else None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def check_swift(job: SwiftJob) -> list[Problem]:
    """ms-swift: the shared LLaMA-Factory-style rules plus swift's own and Megatron's arithmetic."""
    p = check_finetuning(job) + check_deepspeed(job) + check_training(job)
    if job.megatron:
        p += check_megatron(job)
    else:
        p += check_batch(job)
    p += _check_swift_freeze(job) + check_swift_passthrough(job)
    return p


def _check_swift_freeze(job: SwiftJob) -> list[Problem]:
    """freeze maps to swift's full tuner with only the chosen layers trainable (needs the layer count)."""
    f = job.finetuning
    if f.type != "freeze" or job.megatron:
        return []
    if f.freeze_trainable_layers == 0:
        return [Problem("finetuning.freeze_trainable_layers", "0 trains no layer; give N (last N "
                        "layers) or -N (first N layers)")]
    if f.freeze_trainable_layers > 0 and config_int(model_config(job.model), "num_hidden_layers") is None:
        return [Problem("finetuning.freeze_trainable_layers",
                        f"swift selects trainable layers by index, and the last {f.freeze_trainable_layers} "
                        f"need the layer count, but {job.model}/config.json is not readable here; "
                        "use a negative count (first layers), or run mlaunch where the model is")]
    return []


def check_megatron(job: SwiftJob) -> list[Problem]:
    """Megatron-SWIFT: tp x pp divides the world, pp divides the layers, sp needs tp, dp batch."""
    m = job.megatron
    p: list[Problem] = []
    nodes, gpus = world(job)
    size = nodes * gpus
    model_par = m.tp * m.pp
    if job.deepspeed:
        p.append(Problem("deepspeed", "Megatron-SWIFT does its own parallelism and optimizer "
                         "sharding; DeepSpeed cannot be combined with megatron: remove one"))
    if size and size % model_par:
        p.append(Problem("megatron", f"tp {m.tp} × pp {m.pp} = {model_par} does not divide the world "
                         f"size {size} ({nodes} nodes × {gpus} GPUs), so no whole number of "
                         f"data-parallel replicas fits; choose tp × pp among {_divisors(size)}"))
    if m.sequence_parallel and m.tp == 1:
        p.append(Problem("megatron.sequence_parallel", "needs tp > 1: sequence parallelism splits "
                         "activations across the tensor-parallel group; set tp ≥ 2 or remove it"))
    cfg = model_config(job.model)
    layers = config_int(cfg, "num_hidden_layers")
    if layers and layers % m.pp:
        p.append(Problem("megatron.pp", f"the model has {layers} layers ({job.model}/config.json), "
                         f"not divisible by pp {m.pp}; choose pp among {_divisors(layers)}"))
    heads = config_int(cfg, "num_attention_heads")
    if heads and heads % m.tp:
        p.append(Problem("megatron.tp", f"the model has {heads} attention heads ({job.model}/config.json), "
                         f"not divisible by tp {m.tp}; choose tp among {_divisors(heads)}"))
    b = job.batch
    if b.global_ is not None and size and size % model_par == 0:
        dp = size // model_par
        want = dp * b.per_device * b.grad_accum
        if b.global_ != want:
            p.append(Problem("batch.global", f"{b.global_} ≠ dp {dp} × {b.per_device} per device × "
                             f"{b.grad_accum} accumulation = {want} (dp = {size} GPUs / (tp {m.tp} × "
                             f"pp {m.pp})); set global to {want}, change per_device/grad_accum, or omit global"))
    f, t = job.finetuning, job.training
    if f.type == "freeze":
        p.append(Problem("finetuning.type", "freeze is not supported by mlaunch's Megatron-SWIFT mode "
                         "(mcore parameter names differ); use lora or full"))
    if f.quantization_bit:
        p.append(Problem("finetuning.quantization_bit", "Megatron-SWIFT does not train quantized "
                         "(QLoRA) models; remove it or drop the megatron section"))
    if t.lr_scheduler not in MEGATRON_SCHEDULERS:
        p.append(Problem("training.lr_scheduler", f"{t.lr_scheduler} has no Megatron equivalent; "
                         f"use one of {', '.join(MEGATRON_SCHEDULERS)}"))
    if t.epochs is not None and t.epochs != int(t.epochs):
        p.append(Problem("training.epochs", f"Megatron-SWIFT counts whole epochs ({t.epochs} given); "
                         "use a whole number or max_steps"))
    return p


def check_swift_passthrough(job: SwiftJob) -> list[Problem]:
    """Extra swift arguments may not override what mlaunch renders from the spec."""
    p: list[Problem] = []
    if job.cluster.env.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        p.append(Problem("cluster.env.ACCELERATE_USE_CPU", USE_CPU_WHY))
    for key, value in job.passthrough.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            p.append(Problem(f"passthrough.{key}", "not an ms-swift argument name (give it without "
                             "the leading --)"))
        elif key == "deepspeed":
            p.append(Problem("passthrough.deepspeed", DDP_NOT_DEEPSPEED))
        elif key == "train_type":
            p.append(Problem("passthrough.train_type", "ms-swift 4.x rejects --train_type (renamed "
                             "--tuner_type); set finetuning.type instead"))
        elif key == "use_cpu":
            p.append(Problem("passthrough.use_cpu", USE_CPU_WHY))
        elif key in SWIFT_OWNED:
            p.append(Problem(f"passthrough.{key}", f"mlaunch owns this argument; set "
                             f"{SWIFT_OWNED[key]} instead"))
        elif value is None or value == "" or value == []:
            p.append(Problem(f"passthrough.{key}", "empty value; give a value or remove the key"))
    return p

"""Cross-field rules that pydantic's per-field types cannot express.

Each rule returns Problems (field path + what is wrong + how to fix), so that a
spec with several mistakes reports them all at once.
"""
from __future__ import annotations

import re

from ..errors import Problem
from . import known_args
from .ds_rules import _ds_stage, check_deepspeed  # noqa: F401  (swift_rules imports it from here)
from .hosts import LOOPBACK, check_hosts, host_addrs, is_address, machine_key
from .models import Cluster, JobBase, LlamaFactoryJob, ScriptJob
from .select import node_procs, world_size, world_text
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
# Variables that make a trainer's own launcher start processes or a cluster beside mlaunch's
# torchrun (llamafactory-cli and `swift sft` read them): each rank would launch again.
LAUNCHER_ENV = {
    "USE_RAY": "LLaMA-Factory would start Ray on every rank instead of training under mlaunch's "
               "torchrun; mlaunch does not run Ray jobs",
    "RDZV_ID": "it switches llamafactory-cli to an elastic torchrun of its own; mlaunch runs one "
               "static rendezvous (use max_restarts for fault tolerance)",
    "MIN_NNODES": "elastic node counts belong to llamafactory-cli's own torchrun; mlaunch starts "
                  "exactly the nodes in cluster.hosts",
    "MAX_NNODES": "elastic node counts belong to llamafactory-cli's own torchrun; mlaunch starts "
                  "exactly the nodes in cluster.hosts",
    "FORCE_TORCHRUN": "it makes llamafactory-cli start a torchrun of its own; mlaunch already "
                      "runs torchrun on every node",
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
    "ddp_timeout": "training.ddp_timeout", "report_to": "report_to", "run_name": "the run id",
    "use_dora": "finetuning.use_dora", "use_rslora": "finetuning.use_rslora",
    "pissa_init": "finetuning.pissa_init", "additional_target": "finetuning.additional_target",
    "oft_rank": "finetuning.oft_rank", "oft_block_size": "finetuning.oft_block_size",
    "oft_target": "finetuning.oft_target", "quantization_method": "finetuning.quantization_method",
    "fsdp": "fsdp", "fsdp_config": "fsdp", "pref_beta": "preference.beta",
    "pref_loss": "preference.loss", "pref_ftx": "preference.ftx",
    "dpo_label_smoothing": "preference.label_smoothing", "simpo_gamma": "preference.simpo_gamma",
    "kto_chosen_weight": "preference.kto_chosen_weight",
    "kto_rejected_weight": "preference.kto_rejected_weight", "ref_model": "preference.ref_model",
    "ref_model_adapters": "preference.ref_model_adapters",
    "ref_model_quantization_bit": "preference.ref_model_quantization_bit",
    "master_addr": "cluster.master_addr", "master_port": "cluster.master_port",
}


def check_job(job: JobBase) -> list[Problem]:
    """All cross-field problems of a validated job, in field order."""
    problems = check_cluster(job.cluster) + check_output_dir(job)
    if isinstance(job, LlamaFactoryJob):
        problems += check_batch(job) + check_finetuning(job) + check_deepspeed(job)
        problems += check_training(job) + check_passthrough(job)
        from .lf_rules import check_llamafactory   # LLaMA-Factory's own rules live beside it
        problems += check_llamafactory(job)
    elif isinstance(job, ScriptJob):
        problems += check_script(job)
    else:  # ms-swift's rules live beside it; imported here to keep one entry point
        from .swift_rules import check_swift
        problems += check_swift(job)
    return problems


def check_cluster(c: Cluster) -> list[Problem]:
    """Hosts, processes per node, rendezvous address, devices, env names and the interpreter."""
    from .slurm_rules import check_scheduler
    p: list[Problem] = check_scheduler(c, "ssh" in c.model_fields_set)
    if c.scheduler == "slurm":
        return p + _check_env(c)
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
    return p + _check_env(c)


def _check_env(c: Cluster) -> list[Problem]:
    """The remote interpreter and the env names, whatever starts the nodes."""
    p: list[Problem] = []
    if c.python and c.venv:
        p.append(Problem("cluster.venv", "give either python or venv, not both"))
    for name in c.env:
        if not ENV_NAME.match(name):
            p.append(Problem(f"cluster.env.{name}", "not a valid environment variable name"))
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
                             "need their own GPUs; give cuda_visible_devices one list per node, "
                             "e.g. [[0], [1]]"))
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
    remote = [n for n in names if not LOOPBACK.match(n)]
    if LOOPBACK.match(m) and remote:
        return [Problem("cluster.master_addr",
                        f"{m} is loopback, which {remote[0]} cannot reach; use the master's "
                        "cluster-network address")]
    return []


def check_batch(job: LlamaFactoryJob) -> list[Problem]:
    """global = all processes (Σ per node) x per_device x grad_accum, checked before launch.

    Fields left to mlaunch (per_device omitted or auto; grad_accum auto) are chosen later
    (launcher/batchplan.py); here only what the given ones already fix is checked.
    """
    b = job.batch
    size = world_size(job)
    if not size:
        return []
    pd, ga = auto_batch(b)
    if pd is None or ga is None:
        if b.global_ is None:
            return [Problem("batch.global", "required when mlaunch chooses per_device or grad_accum "
                            "(omitted or auto): give the global batch, e.g. global: 64")]
        unit = size * (pd or 1) * (ga or 1)
        if b.global_ % unit:
            what = " × ".join([world_text(job.cluster)] + ([f"{pd} per device"] if pd else [])
                              + ([f"{ga} accumulation"] if ga else []))
            return [Problem("batch.global", f"{b.global_} is not a multiple of {what} = {unit}; "
                            f"set global to a multiple of {unit}")]
        return []
    if b.global_ is None:
        return []
    want = size * pd * ga
    if b.global_ == want:
        return []
    return [Problem("batch.global",
                    f"{b.global_} ≠ {world_text(job.cluster)} × {pd} per device × "
                    f"{ga} accumulation = {want}; set global to {want}, change "
                    "per_device/grad_accum, or omit global")]


def auto_batch(b) -> tuple[int | None, int | None]:
    """(per_device, grad_accum) as given; None where mlaunch chooses or derives. An omitted
    grad_accum is global / (world × per_device) when both are given, else 1 (its default)."""
    pd = b.per_device if isinstance(b.per_device, int) else None
    given = "grad_accum" in b.model_fields_set or (pd is not None and b.global_ is None)
    ga = b.grad_accum if isinstance(b.grad_accum, int) and given else None
    return pd, ga


def check_finetuning(job: LlamaFactoryJob) -> list[Problem]:
    """Knobs of one method set while another method is chosen are mistakes, not no-ops."""
    f = job.finetuning
    p: list[Problem] = []
    groups = {("lora",): ("lora_rank", "lora_alpha", "lora_dropout", "lora_target", "use_dora",
                          "use_rslora", "pissa_init"),
              ("lora", "oft"): ("quantization_bit", "quantization_method", "additional_target"),
              ("oft",): ("oft_rank", "oft_block_size", "oft_target"),
              ("freeze",): ("freeze_trainable_layers", "freeze_trainable_modules")}
    for methods, names in groups.items():
        for name in sorted(set(names) & f.model_fields_set):
            if f.type not in methods:
                p.append(Problem(f"finetuning.{name}", f"only applies to type {' or '.join(methods)}, "
                                 f"but type is {f.type}; remove it"))
    p += _check_quantization(f)
    if f.quantization_bit and job.deepspeed and _ds_stage(job) == 3:
        p.append(Problem("finetuning.quantization_bit",
                         "QLoRA cannot be combined with ZeRO-3; use deepspeed stage 0-2 or no quantization"))
    return p


# On-the-fly quantization widths LLaMA-Factory 0.9.5 accepts per method (model/model_utils/quantization.py).
QUANT_BITS = {"bnb": (4, 8), "hqq": (1, 2, 3, 4, 5, 6, 8), "eetq": (8,)}


def _check_quantization(f) -> list[Problem]:
    """quantization_bit must be a width the chosen quantization_method implements."""
    bits = QUANT_BITS[f.quantization_method]
    if f.quantization_bit is None or f.quantization_bit in bits:
        return []
    others = "; ".join(f"{m}: {', '.join(map(str, b))}" for m, b in QUANT_BITS.items()
                       if m != f.quantization_method)
    return [Problem("finetuning.quantization_bit",
                    f"{f.quantization_bit} is not one of {', '.join(map(str, bits))} for "
                    f"quantization_method {f.quantization_method} ({others})")]


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
    before = len(p)
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
    flagged = {q.path for q in p[before:]}
    free = [k for k in job.passthrough if f"passthrough.{k}" not in flagged]
    return p + known_args.check("llamafactory", "llamafactory", free,
                                f"LLaMA-Factory {known_args.version('llamafactory')}")


def check_script(job: ScriptJob) -> list[Problem]:
    """A script job names exactly one of a file or a module."""
    s = job.script
    if (s.path is None) == (s.module is None):
        return [Problem("script", "give exactly one of path (a .py file) or module (python -m)")]
    return []

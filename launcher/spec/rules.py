"""Cross-field rules that pydantic's per-field types cannot express.

Each rule returns Problems (field path + what is wrong + how to fix), so that a
spec with several mistakes reports them all at once. check_job (check.py) is the one entry point; here
stand the LLaMA-Factory job's batch, method, schedule and passthrough rules, beside them the
cluster block's (cluster_rules.py) and each trainer's own (lf_rules.py, swift_rules.py, ...).
"""
from __future__ import annotations

import re

from ..errors import Problem
from . import known_args
# The cluster block's rules live beside it (cluster_rules.py); their names stay importable here.
from .cluster_rules import ENV_NAME, LAUNCHER_ENV, OWNED_ENV, RENDEZVOUS_WHY  # noqa: F401
from .cluster_rules import _check_shared_hosts, machines, node_devices, node_path_notes, output_dir_note  # noqa: F401
from .cluster_rules import check_cluster, check_output_dir
from .ds_rules import _ds_stage, check_deepspeed  # noqa: F401  (swift_rules imports it from here)
from .model_config import divisor_list
from .models import GLOBAL_MAX, GRAD_ACCUM_MAX, PER_DEVICE_MAX, JobBase, LlamaFactoryJob, ScriptJob
from .secret_rules import check_batch_secrets, check_passthrough_secrets, check_script_secrets
from .owned import LLAMAFACTORY_OWNED  # noqa: F401  (importable from here)
from .select import auto_batch, world_factor, world_size, world_text  # noqa: F401  (importable from here)


def check_dataset(job: JobBase) -> list[Problem]:
    """An empty dataset (`[]`, `""`, or an empty name in a list) would render `dataset: ""`,
    which the trainer reads as no dataset at all and stops at start on every node."""
    given = getattr(job, "dataset", None)
    if given is None:
        return []
    names = [given] if isinstance(given, str) else list(given)
    example = "alpaca_en_demo" if job.trainer == "llamafactory" else "AI-ModelScope/alpaca-gpt4-data-en"
    if not names or not any(n.strip() for n in names):
        return [Problem("dataset", f"{given!r} names no dataset; give one, e.g. `dataset: {example}`, "
                        f"or a list of them")]
    empty = [i for i, n in enumerate(names) if not n.strip()]
    if empty and not isinstance(given, str):
        return [Problem(f"dataset[{empty[0]}]", f"{names[empty[0]]!r} is an empty name; remove it "
                        "from the list or write the dataset's name")]
    return []


def check_batch(job: LlamaFactoryJob) -> list[Problem]:
    """global = all processes (Σ per node) x per_device x grad_accum, checked before launch.

    Fields left to mlaunch (per_device omitted or auto; grad_accum auto) are chosen later
    (launcher/plan/batch.py); here only what the given ones already fix is checked.
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
            what = " × ".join([world_factor(job.cluster)] + ([f"{pd} per device"] if pd else [])
                              + ([f"{ga} accumulation"] if ga else []))
            return [Problem("batch.global", f"{b.global_} is not a multiple of {what} = {unit}; "
                            f"set global to a multiple of {unit}")]
        return _derived_limits(job, size, pd, ga)
    want = size * pd * ga
    if b.global_ is None:
        if want <= GLOBAL_MAX:
            return []
        return [Problem("batch.global", f"{world_factor(job.cluster)} × {pd} per device × {ga} "
                        f"accumulation = {want}, over the limit of {GLOBAL_MAX} (2^31 - 1, past any "
                        "real job); lower per_device or grad_accum")]
    if b.global_ == want:
        return []
    return [Problem("batch.global",
                    f"{b.global_} ≠ {world_factor(job.cluster)} × {pd} per device × "
                    f"{ga} accumulation = {want}; set global to {want}, change "
                    "per_device/grad_accum, or omit global")]


def _derived_limits(job, size: int, pd: int | None, ga: int | None) -> list[Problem]:
    """The per_device or grad_accum that global fixes (or leaves mlaunch to split) stays within
    the limits the fields have when given (spec.models: PER_DEVICE_MAX, GRAD_ACCUM_MAX)."""
    per_rank = job.batch.global_ // size
    world = world_factor(job.cluster)
    if pd is not None and per_rank // pd > GRAD_ACCUM_MAX:
        return [Problem("batch.grad_accum", f"global {job.batch.global_} / ({world} × {pd} per device) "
                        f"= {per_rank // pd} accumulation steps, over the limit of {GRAD_ACCUM_MAX}; "
                        "raise per_device or lower global")]
    if ga is not None and per_rank // ga > PER_DEVICE_MAX:
        return [Problem("batch.per_device", f"global {job.batch.global_} / ({world} × {ga} accumulation) "
                        f"= {per_rank // ga} per device, over the limit of {PER_DEVICE_MAX}; "
                        "raise grad_accum or lower global")]
    if pd is None and ga is None and not batch_splits(per_rank):
        return [Problem("batch.global", f"{job.batch.global_} / {world} = {per_rank} samples per "
                        f"process, which no per_device ≤ {PER_DEVICE_MAX} × grad_accum ≤ "
                        f"{GRAD_ACCUM_MAX} makes; choose a global with more divisors (e.g. a "
                        "multiple of a power of 2)")]
    return []


def batch_splits(per_rank: int) -> list[int]:
    """The micro-batches b dividing per_rank with b ≤ PER_DEVICE_MAX and per_rank / b ≤
    GRAD_ACCUM_MAX: the per_device values mlaunch may choose (O(sqrt(per_rank)) steps)."""
    return [d for d in divisor_list(per_rank) if d <= PER_DEVICE_MAX and per_rank // d <= GRAD_ACCUM_MAX]



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
    # LLaMA-Factory loads bnb 4-bit weights sharded under ZeRO-3 (it sets bnb_4bit_quant_storage
    # to the compute dtype; its own rules: lf_rules.py); ms-swift leaves the storage uint8, which
    # ZeRO-3 cannot shard
    if f.quantization_bit and job.trainer != "llamafactory" and job.deepspeed and _ds_stage(job) == 3:
        p.append(Problem("finetuning.quantization_bit",
                         "QLoRA cannot be combined with ZeRO-3 under ms-swift (it keeps the 4-bit "
                         "weights' storage uint8, which ZeRO-3 cannot shard); use deepspeed stage "
                         "0-2, or no quantization"))
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
                         + (" (max_steps would silently win); to run by steps, set epochs to null "
                            "(on the command line: training.epochs=null training.max_steps=N)"
                            if t.epochs else "")))
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
    p += [q for q in check_passthrough_secrets(job.passthrough, "LLaMA-Factory")
          if q.path not in {x.path for x in p}]
    flagged = {q.path for q in p[before:]}
    free = [k for k in job.passthrough if f"passthrough.{k}" not in flagged]
    return p + known_args.check("llamafactory", "llamafactory", free,
                                f"LLaMA-Factory {known_args.version('llamafactory')}")


def check_script(job: ScriptJob) -> list[Problem]:
    """A script job names exactly one of a file or a module."""
    s = job.script
    if (s.path is None) == (s.module is None):
        return [Problem("script", "give exactly one of path (a .py file) or module (python -m)")]
    return check_script_secrets(s.args)


def check_restarts(job, why: str | None) -> list[Problem]:
    """max_restarts on a job none of whose checkpoints a restart could resume (why: the
    trainer's reason, or None): refused, with the reason."""
    if job.max_restarts and why:
        return [Problem("max_restarts", f"{job.max_restarts}: no restart could resume a checkpoint: "
                        f"{why}; remove that key or set max_restarts: 0")]
    return []

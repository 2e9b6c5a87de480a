"""Batch planning: fill in per_device, grad_accum and gradient checkpointing from the memory
estimate (launcher/plan/memory.py), or check the user's values against it. Pure: the caller
brings the GPU memory and the model's config.json (MemoryInputs).

The choice, among micro-batches b that divide global / world (accumulation = the rest):
the fastest that fits in (1 - batch.memory_margin) of the smallest GPU. Speed is modelled
as t / (t + T0) for t = b·s tokens per micro-batch (fixed per-step costs amortised; T0 is
fitted to GPU runs and scaled by 1/Ψ), divided by CKPT_COST with recomputation (the forward
runs twice). Both figures' sources: bench/results/memory/README.md.
So checkpointing off and the largest micro-batch win, unless checkpointing buys a much
larger micro-batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from . import memory
from ..errors import Problem, UserError
from ..spec import JobBase, LlamaFactoryJob, SwiftJob, world_size
from ..spec.ds_rules import zero_of
from ..spec.rules import auto_batch, batch_splits

CKPT_COST = 1.37
T0_TOKENS, T0_PARAMS = 8000.0, 0.39e9
ASSUMED_GIB = 80.0         # a dry run without cluster.gpu_memory_gb plans for an 80 GB GPU
FALLBACK_MICRO = 4          # largest micro-batch when the model's shape is unknown


@dataclass(frozen=True)
class MemoryInputs:
    """What planning knows of the hardware and the model, and where each came from."""

    gpu_gib: float | None = None
    gpu_source: str = "unknown"
    model_config: dict | None = None
    config_source: str = "not read"


@dataclass(frozen=True)
class Candidate:
    micro_batch: int
    checkpointing: bool
    total: float                    # estimated bytes per GPU
    fits: bool


@dataclass(frozen=True)
class Decision:
    """The batch numbers the plan renders, the estimate behind them, and why."""

    job: JobBase                                # with concrete per_device/grad_accum/checkpointing
    per_device: int
    grad_accum: int
    checkpointing: bool
    chosen: tuple[str, ...]                     # the fields mlaunch filled in
    inputs: MemoryInputs
    estimate: memory.Estimate | None = None
    budget: float | None = None                 # bytes the estimate may use per GPU
    why: tuple[str, ...] = ()
    problems: tuple[Problem, ...] = ()          # refusals; --force overrides them
    candidates: tuple[Candidate, ...] = field(default=())
    defaulted: tuple[str, ...] = ()             # the fields the spec left to their defaults


def plannable(job: JobBase) -> bool:
    """Jobs with a batch to plan (LLaMA-Factory, ms-swift without Megatron)."""
    return isinstance(job, (LlamaFactoryJob, SwiftJob)) and not getattr(job, "megatron", None)


def resolve(job: JobBase, inputs: MemoryInputs | None = None) -> Decision | None:
    """The decision for job (None for jobs without a batch); never raises for memory reasons."""
    if not isinstance(job, (LlamaFactoryJob, SwiftJob)):
        return None
    inputs = inputs or MemoryInputs()
    b, tr = job.batch, job.training
    size = _size(job)
    pd, ga = auto_batch(b)
    if not plannable(job):               # Megatron: the batch is explicit (megatron_rules)
        ga = b.grad_accum if isinstance(b.grad_accum, int) else ga
    ck = tr.gradient_checkpointing if isinstance(tr.gradient_checkpointing, bool) else None
    if pd is None and "gradient_checkpointing" not in tr.model_fields_set:
        ck = None                        # omitted while mlaunch picks the batch: picked too
    if pd is not None and ga is None:
        ga = b.global_ // (size * pd)    # arithmetic, not a choice (validation checked it divides)
    chosen = tuple(n for n, v in (("per_device", pd), ("grad_accum", ga),
                                  ("gradient_checkpointing", ck)) if v is None)
    defaulted = ("gradient_checkpointing",) if ck is not None and \
        "gradient_checkpointing" not in tr.model_fields_set else ()
    shape = memory.shape_from_config(inputs.model_config)
    if not plannable(job) or shape is None:
        return replace(_blind(job, inputs, pd, ga, ck, chosen, size), defaulted=defaulted)
    gpu = inputs.gpu_gib if inputs.gpu_gib is not None else ASSUMED_GIB
    budget = gpu * (1 - b.memory_margin) * memory.GIB
    per_rank = b.global_ // size if b.global_ else None
    micros = [pd] if pd else ([per_rank // ga] if ga else batch_splits(per_rank))
    cands = [Candidate(m, c, t := memory.estimate(shape, setting(job, shape, m, c)).total, t <= budget)
             for m in micros for c in ([ck] if ck is not None else [False, True])]
    pick = _best(cands, shape, job) if chosen else cands[0]
    acc = ga or per_rank // pick.micro_batch
    est = memory.estimate(shape, setting(job, shape, pick.micro_batch, pick.checkpointing))
    why, problems = _explain(job, shape, inputs, cands, pick, chosen, budget, gpu)
    if inputs.gpu_gib is None and problems:   # an assumed size refuses nothing: say it instead
        why += [f"would not fit the assumed {ASSUMED_GIB:g} GiB: {p.message}" for p in problems]
        problems = []
    return Decision(_concrete(job, pick.micro_batch, acc, pick.checkpointing), pick.micro_batch, acc,
                    pick.checkpointing, chosen, inputs, est, budget, tuple(why), tuple(problems),
                    tuple(cands), defaulted)


def setting(job, shape: memory.Shape, micro: int, ckpt: bool) -> memory.Setting:
    """The memory.Setting of job at one micro-batch and checkpointing choice."""
    f = job.finetuning
    zero_stage, off_opt, off_param = zero_of(job)   # any deepspeed form: stage, name, user file
    seq = job.cutoff_len if isinstance(job, LlamaFactoryJob) else job.max_length
    attn = str(job.passthrough.get("flash_attn", job.passthrough.get("attn_impl", ""))).lower()
    return memory.Setting(
        finetuning=f.type, lora_rank=f.lora_rank, lora_targets=memory.lora_targets(f.lora_target),
        freeze_layers=f.freeze_trainable_layers, quant_bits=f.quantization_bit,
        precision=job.precision, zero_stage=zero_stage, offload_optimizer=off_opt,
        offload_param=off_param, seq_len=seq, micro_batch=micro,
        checkpointing=ckpt, world=_size(job), eager_attention=attn in ("disabled", "eager"))


def speed(shape: memory.Shape, seq: int, c: Candidate) -> float:
    """Relative samples/s of a candidate (the module docstring's model)."""
    t = c.micro_batch * seq
    t0 = max(256.0, T0_TOKENS * T0_PARAMS / shape.params())
    return t / (t + t0) / (CKPT_COST if c.checkpointing else 1.0)


def _best(cands: list[Candidate], shape, job) -> Candidate:
    """The fastest fitting candidate; ties: checkpointing off, then the larger micro-batch.
    Nothing fits: the smallest (micro-batch 1, checkpointing on), refused by _explain."""
    seq = job.cutoff_len if isinstance(job, LlamaFactoryJob) else job.max_length
    fit = [c for c in cands if c.fits]
    if not fit:
        return min(cands, key=lambda c: (c.total, c.micro_batch))
    return max(fit, key=lambda c: (round(speed(shape, seq, c), 9), not c.checkpointing, c.micro_batch))


def _explain(job, shape, inputs, cands, pick, chosen, budget, gpu) -> tuple[list[str], list[Problem]]:
    """The why lines and, when the pick does not fit, the refusal with its fix."""
    margin = job.batch.memory_margin
    room = f"{gpu:.1f} GiB per GPU ({budget / memory.GIB:.1f} usable with {margin:.0%} kept free)"
    if inputs.gpu_gib is None:
        hint = ", or submit (preflight reads nvidia-smi)" if "without preflight" in inputs.gpu_source else ""
        why = [f"GPU memory: assumed {ASSUMED_GIB:g} GiB ({inputs.gpu_source}); set "
               f"cluster.gpu_memory_gb{hint}"]
    else:
        why = [f"GPU memory: {gpu:.1f} GiB ({inputs.gpu_source})"]
    why.append(f"model shape: {_count(shape.params())} parameters, {shape.layers} layers, hidden "
               f"{shape.hidden}, vocab {shape.vocab} ({inputs.config_source})")
    est = pick.total / memory.GIB
    if pick.fits:
        if chosen:
            seq = setting(job, shape, 1, False).seq_len
            faster = [c for c in cands if not c.fits and speed(shape, seq, c) > speed(shape, seq, pick)]
            nxt = min(faster, key=lambda c: speed(shape, seq, c), default=None)
            why.append(f"chose the fastest setting that fits: per_device {pick.micro_batch}, gradient "
                       f"checkpointing {_onoff(pick.checkpointing)}: estimated {est:.1f} GiB of {room}")
            if nxt:
                why.append(f"faster but too big: per_device {nxt.micro_batch} with checkpointing "
                           f"{_onoff(nxt.checkpointing)} needs {nxt.total / memory.GIB:.1f} GiB")
        else:
            why.append(f"your settings fit: estimated {est:.1f} GiB of {room}")
        return why, []
    if "per_device" in chosen:
        return why, [Problem("batch", f"nothing fits in {room}: even per_device {pick.micro_batch} with "
                             f"gradient checkpointing {_onoff(pick.checkpointing)} needs an estimated "
                             f"{est:.1f} GiB ({_top(job, shape, pick)}); use {fixes(job)} (or --force-unfit)")]
    return why, [Problem("batch", f"estimated {est:.1f} GiB per GPU of {gpu:.1f} ({budget / memory.GIB:.1f} "
                         f"usable) with per_device {pick.micro_batch}, gradient checkpointing "
                         f"{_onoff(pick.checkpointing)}: {_fix(job, shape, pick, budget)} (or --force-unfit)")]


def _fix(job, shape, pick: Candidate, budget: float) -> str:
    """What makes an explicit setting fit: checkpointing, a smaller per_device, or the big levers."""
    out = []
    if not pick.checkpointing and memory.estimate(shape, setting(job, shape, pick.micro_batch, True)).total <= budget:
        out.append("set training.gradient_checkpointing: true")
    per_rank = job.batch.global_ // _size(job) if job.batch.global_ else None
    small = next((m for m in range(pick.micro_batch - 1, 0, -1) if (not per_rank or per_rank % m == 0)
                  and memory.estimate(shape, setting(job, shape, m, pick.checkpointing)).total <= budget), None)
    if small:   # with a global batch, a per_device that divides it, and the accumulation to match
        out.append(f"per_device {small} with grad_accum {per_rank // small}" if per_rank else f"per_device ≤ {small}")
    return ", or ".join(out) if out else "use " + fixes(job)


def fixes(job) -> str:
    """The big levers that job does not pull yet."""
    seq = "cutoff_len" if isinstance(job, LlamaFactoryJob) else "max_length"
    stage, off_opt, _ = zero_of(job)
    out = [] if stage == 3 else ["deepspeed stage 3 (model states ÷ GPUs)"]
    if not off_opt:
        out.append("deepspeed offload_optimizer: cpu")
    if job.finetuning.type != "lora":
        out.append("finetuning type lora")
    return ", ".join(out + [f"a shorter {seq}"])


def _top(job, shape, pick: Candidate) -> str:
    """The two largest terms, for the refusal line."""
    terms = sorted(memory.estimate(shape, setting(job, shape, pick.micro_batch, pick.checkpointing)).terms,
                   key=lambda kv: -kv[1])[:2]
    return ", ".join(f"{k} {v / memory.GIB:.1f}" for k, v in terms)


def _blind(job, inputs, pd, ga, ck, chosen, size) -> Decision:
    """No estimate possible (shape unknown, or Megatron): keep the user's values, fill the rest
    conservatively, and say so."""
    b = job.batch
    per_rank = b.global_ // size if b.global_ else None
    why = []
    if pd is None:
        pd = per_rank // ga if ga else _cautious(per_rank)
    ga = ga or (per_rank // pd if per_rank else 1)
    if ck is None:
        ck = True
    if chosen:
        why.append(f"model config.json not readable ({inputs.config_source}): no memory estimate; chose "
                   f"the cautious per_device {pd}, gradient checkpointing on; give batch.per_device "
                   "and training.gradient_checkpointing to decide yourself")
    elif plannable(job):
        why.append(f"no memory estimate: model config.json not readable ({inputs.config_source})")
    return Decision(_concrete(job, pd, ga, ck), pd, ga, ck, chosen, inputs, why=tuple(why))


def _concrete(job, pd: int, ga: int, ck: bool):
    """job with the numbers filled in (what every template and ds_config reads). Fields that
    already hold the value stay untouched, so "given in the spec" (model_fields_set) still
    tells what the user wrote (Megatron's recompute default reads it)."""
    b, tr = job.batch, job.training
    batch = {k: v for k, v in (("per_device", pd), ("grad_accum", ga)) if getattr(b, k) != v}
    train = {"gradient_checkpointing": ck} if tr.gradient_checkpointing is not ck else {}
    if not batch and not train:
        return job
    return job.model_copy(update={"batch": b.model_copy(update=batch) if batch else b,
                                  "training": tr.model_copy(update=train) if train else tr})


def _size(job) -> int:
    """Data-parallel ranks (Megatron jobs are never planned, only filled in)."""
    return world_size(job)


def _cautious(per_rank: int) -> int:
    """The largest micro-batch up to FALLBACK_MICRO that divides per_rank, else (its
    accumulation over GRAD_ACCUM_MAX) the smallest one within the limits (spec/rules.py
    checked that one exists)."""
    splits = batch_splits(per_rank)
    small = [d for d in splits if d <= FALLBACK_MICRO]
    return max(small) if small else min(splits)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def _onoff(v: bool) -> str:
    return "on" if v else "off"


def refuse_unfit(decision, force: bool) -> None:
    """Raise the decision's refusals (one line each) unless --force."""
    if decision is not None and decision.problems and not force:
        raise UserError(list(decision.problems), header="the batch will not fit on the GPUs; "
                        "nothing was started:")


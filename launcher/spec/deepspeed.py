"""The DeepSpeed config of a job, with every "auto" resolved and the source of every value.

Three starting points: mlaunch's default for `deepspeed: {stage: N, ...}` (templates/
ds_config.json.j2), ms-swift 4.6's own file for a name (`deepspeed: zero3`), or the user's
file (`deepspeed: {config: ds.json}`). Then the keys the spec owns (batch, clipping,
precision) are set or checked, and every "auto" becomes the number transformers would
compute on the nodes (transformers/integrations/deepspeed.py: trainer_config_process and
trainer_config_finalize), so the rendered file states what the run will use.

No optimizer block is stated: the Trainer builds its own optimizer (LoRA+, GaLore, BAdam,
Muon, `optim` choices, ms-swift's plugins) with the YAML's weight decay and betas.
"""
from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from ..errors import Problem
from .swift_zero import AUTO, SWIFT_ZERO

PLANNED = "chosen by mlaunch's batch planning"
SPEC_TUNING = ("overlap_comm", "contiguous_gradients", "reduce_bucket_size", "allgather_bucket_size",
               "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
               "stage3_max_live_parameters", "stage3_max_reuse_distance", "sub_group_size")
STAGE3_ONLY = tuple(k for k in SPEC_TUNING if k.startswith("stage3_")) + ("sub_group_size",)
# transformers' trainer_config_finalize: buckets sized from the model's hidden size h.
HIDDEN_RULES = {"zero_optimization.reduce_bucket_size": ("h²", lambda h: h * h),
                "zero_optimization.stage3_prefetch_bucket_size": ("0.9 × h²", lambda h: int(0.9 * h * h)),
                "zero_optimization.stage3_param_persistence_threshold": ("10 × h", lambda h: 10 * h)}
# LLaMA-Factory passthrough keys that make create_custom_optimizer build the optimizer.
CUSTOM_OPTIMIZERS = ("loraplus_lr_ratio", "use_galore", "use_apollo", "use_badam", "use_adam_mini",
                     "use_muon")
HF_ADAM = {"adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "weight_decay": 0.0}


@dataclass
class DsConfig:
    """The resolved config, where each leaf value came from, and what is wrong with it."""

    config: dict
    sources: dict[str, str] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def stage(self) -> int | None:
        s = self.config.get("zero_optimization", {}).get("stage")
        return s if isinstance(s, int) else None

    def note(self) -> str:
        """One line per value: key = value  <- source (the dry run prints it above the file)."""
        width = max((len(k) for k in self.sources), default=0)
        return "\n".join(f"{k:<{width}} = {json.dumps(_get(self.config, k))}  <- {src}"
                         for k, src in self.sources.items())


def read_user_file(path: str) -> tuple[dict | None, str | None]:
    """(the parsed ds_config.json, None) or (None, why it cannot be used). Only a regular
    file within CONFIG_CAP (spec/inputs.py): a FIFO or /dev/zero is refused, never read."""
    from ..errors import SpecError
    from .inputs import CONFIG_CAP, Unreadable, read_input
    try:
        data = json.loads(read_input(os.path.expanduser(path), "deepspeed.config", CONFIG_CAP))
    except Unreadable as e:
        return None, (f"cannot read {path}: {e.strerror}; give the path of a readable JSON file "
                      "(a relative one is taken from the spec's folder), or leave config out and "
                      "let mlaunch write it (deepspeed: {stage: N})")
    except SpecError as e:
        return None, str(e.problems[0])
    except json.JSONDecodeError as e:
        return None, (f"{path} is not JSON: {e.msg} at line {e.lineno}, column {e.colno}; fix it "
                      "there (keys and strings in double quotes, no trailing comma, no comments)")
    except ValueError as e:
        return None, f"{path} is not JSON: {e}; save it as UTF-8 JSON text"
    return (data, None) if isinstance(data, dict) else (None, f"{path}: expected a JSON object")


def build_for(job: Any) -> DsConfig:
    """The job's DeepSpeed config (its problems empty once the spec validated)."""
    from .. import render

    ds = job.deepspeed
    spec_form = ds.config is None and ds.name is None and ds.stage is not None
    return build(job, render.ds_default(ds) if spec_form else None)


def build(job: Any, base: dict | None = None) -> DsConfig:
    """The job's DeepSpeed config. base: mlaunch's default for a spec-form section."""
    from .select import world_size
    from .model_config import config_int, model_config

    ds = job.deepspeed
    out = DsConfig({})
    if ds.config is not None:
        data, why = read_user_file(ds.config)
        if why:
            return DsConfig({}, problems=[Problem("deepspeed.config", why)])
        _start(out, data, f"your file {ds.config}")
        out.problems += [Problem(f"deepspeed.{k}", f"set it in {ds.config}, or drop deepspeed.config")
                         for k in sorted(ds.model_fields_set - {"config", "zero3_init_flag"})]
    elif ds.name is not None:
        _start(out, {"zero_optimization": copy.deepcopy(SWIFT_ZERO[ds.name])},
               f"ms-swift 4.6 {ds.name}.json")
    else:
        _start(out, base or {}, "mlaunch default")
        _spec_tuning(out, ds)
    _spec_owned(out, job, world_size(job))
    _optimizer(out, job)
    _scheduler(out, job)
    cfg = model_config(job.model)
    hidden = config_int(cfg, "hidden_size") or max((cfg or {}).get("hidden_sizes") or [0]) or None
    _hidden(out, hidden, job.model)
    _leftover_auto(out, job)
    _zero_rules(out)
    return out


def _start(out: DsConfig, data: dict, source: str) -> None:
    out.config = copy.deepcopy(data)
    out.sources = {k: source for k in _leaves(out.config)}


def _spec_tuning(out: DsConfig, ds: Any) -> None:
    """`deepspeed: {overlap_comm: ..., reduce_bucket_size: ...}` over mlaunch's defaults."""
    zero = out.config.setdefault("zero_optimization", {})
    for key in list(out.sources):   # the template's values that the spec's fields decide
        part = key.split(".")
        if key == "zero_optimization.stage" or part[-1] in ("device", "nvme_path"):
            out.sources[key] = f"spec: deepspeed.{part[1] if part[-1] == 'device' else part[-1]}"
    for key in SPEC_TUNING:
        value = getattr(ds, key)
        if value is None:
            continue
        if key in STAGE3_ONLY and ds.stage != 3:
            out.problems.append(Problem(f"deepspeed.{key}", f"only applies to ZeRO-3 (stage is "
                                        f"{ds.stage}); remove it or use stage 3"))
        zero[key] = value
        out.sources[f"zero_optimization.{key}"] = f"spec: deepspeed.{key}"


def _set(out: DsConfig, key: str, want: Any, why: str, fix: str) -> None:
    """A key the spec owns: absent or "auto" -> want; another value is a contradiction."""
    parent, name = _parent(out.config, key, create=True)
    have = parent.get(name)
    if have is None or have == AUTO:
        parent[name] = want
        default = out.sources.get(key, "").startswith("mlaunch")
        out.sources[key] = f"{'auto -> ' if have == AUTO and not default else ''}{why}"
    elif have != want:
        src = out.sources.get(key, "the config")
        out.problems.append(Problem("deepspeed.config", f"{key} {json.dumps(have)} in {src} ≠ {why} "
                                    f"= {json.dumps(want)}; {fix}"))
    else:
        out.sources[key] += f" (= {why})"


def _spec_owned(out: DsConfig, job: Any, size: int) -> None:
    """Batch sizes, clipping and precision, exactly as the YAML/arguments give them."""
    from .select import auto_batch

    b, fix = job.batch, 'set it to "auto" or change the spec\'s batch'
    pd, ga = auto_batch(b)   # None: mlaunch chooses it later (launcher/plan/batch.py)
    for key, value, name in (("train_micro_batch_size_per_gpu", pd, "per_device"),
                             ("gradient_accumulation_steps", ga, "grad_accum")):
        if value is not None:
            _set(out, key, value, f"batch.{name}", fix)
        elif _get(out.config, key) in (None, AUTO):
            out.sources[key] = PLANNED   # validation only: the plan's job has the number
        else:
            out.problems.append(Problem("deepspeed.config", f"{key} {json.dumps(_get(out.config, key))} "
                                        f"in {out.sources[key]} but batch.{name} is left to mlaunch; "
                                        f'set it to "auto" or give batch.{name}'))
    if pd is not None and ga is not None:
        from .select import world_factor
        _set(out, "train_batch_size", size * pd * ga, f"{world_factor(job.cluster)} "
             f"× {pd} per device × {ga} accumulation", fix)
    elif b.global_ is not None:
        _set(out, "train_batch_size", b.global_, "batch.global", fix)
    _set(out, "gradient_clipping", job.training.max_grad_norm, "training.max_grad_norm",
         'set it to "auto" or change training.max_grad_norm')
    for kind in ("bf16", "fp16"):
        if kind in out.config or job.precision == kind:
            _set(out, f"{kind}.enabled", job.precision == kind, f"precision {job.precision}",
                 'set it to "auto" or change precision')


def _optimizer(out: DsConfig, job: Any) -> None:
    """A user file's optimizer block: kept for a plain AdamW job, its "auto" values filled."""
    if "optimizer" not in out.config:
        return
    src = out.sources.get(next((k for k in out.sources if k.startswith("optimizer.")), ""), "the config")
    out.sources["optimizer"] = "refused"  # its "auto" values are not reported once more
    if job.trainer == "swift":
        out.problems.append(Problem("deepspeed.config", f"optimizer block in {src}: ms-swift builds its "
                                    "own optimizer and stops with \"'DummyOptim' object has no attribute "
                                    "'param_groups'\"; remove the block (weight_decay, adam_beta2... go "
                                    "in passthrough)"))
        return
    custom = [k for k in CUSTOM_OPTIMIZERS if job.passthrough.get(k) not in (None, False)]
    if job.passthrough.get("optim", "adamw_torch") != "adamw_torch":
        custom.append(f"optim {job.passthrough['optim']}")
    if custom:
        out.problems.append(Problem("deepspeed.config", f"optimizer block in {src} replaces the "
                                    f"optimizer that passthrough.{custom[0]} asks for (transformers hands "
                                    "DeepSpeed a placeholder, LLaMA-Factory's custom optimizer never runs); "
                                    "remove the block"))
        return
    del out.sources["optimizer"]
    hp = {k: job.passthrough.get(k, v) for k, v in HF_ADAM.items()}
    fix = 'set it to "auto" (transformers stops at start on a mismatch)'
    where = lambda k: f"passthrough.{k}" if k in job.passthrough else f"{k} (transformers default)"
    _set(out, "optimizer.params.lr", job.training.learning_rate, "training.learning_rate", fix)
    _set(out, "optimizer.params.betas", [hp["adam_beta1"], hp["adam_beta2"]],
         f"[{where('adam_beta1')}, {where('adam_beta2')}]", fix)
    _set(out, "optimizer.params.eps", hp["adam_epsilon"], where("adam_epsilon"), fix)
    _set(out, "optimizer.params.weight_decay", hp["weight_decay"], where("weight_decay"), fix)


def _scheduler(out: DsConfig, job: Any) -> None:
    """A user file's scheduler block (it replaces training.lr_scheduler): its "auto" values."""
    if "scheduler" not in out.config:
        return
    tr, fix = job.training, 'set it to "auto" (transformers stops at start on a mismatch)'
    _set(out, "scheduler.params.warmup_min_lr", 0, "transformers' fill (0)", fix)
    _set(out, "scheduler.params.warmup_max_lr", tr.learning_rate, "training.learning_rate", fix)
    if tr.max_steps:
        _set(out, "scheduler.params.total_num_steps", tr.max_steps, "training.max_steps", fix)
        warm = tr.warmup_steps if tr.warmup_steps is not None else math.ceil((tr.warmup_ratio or 0) * tr.max_steps)
        _set(out, "scheduler.params.warmup_num_steps", warm, "training.warmup_* of max_steps", fix)
    elif tr.warmup_steps is not None:
        _set(out, "scheduler.params.warmup_num_steps", tr.warmup_steps, "training.warmup_steps", fix)


def _hidden(out: DsConfig, hidden: int | None, model: str) -> None:
    """The hidden-size buckets: transformers' numbers, from config.json when it is readable here."""
    for key, (rule, fn) in HIDDEN_RULES.items():
        parent, name = _parent(out.config, key)
        if parent is None or parent.get(name) != AUTO:
            continue
        if hidden:
            parent[name] = fn(hidden)
            out.sources[key] = f"auto -> transformers' rule {rule}, h = {hidden} ({model}/config.json)"
        else:
            out.sources[key] = (f"kept \"auto\": transformers sets {rule} from the loaded model at "
                                f"start ({model}/config.json is not readable here)")


def _leftover_auto(out: DsConfig, job: Any) -> None:
    """An "auto" that neither mlaunch nor transformers resolves would reach DeepSpeed as text."""
    for key, value in _leaves(out.config).items():
        refused = key.startswith("optimizer.") and out.sources.get("optimizer") == "refused"
        if value != AUTO or key in HIDDEN_RULES or refused or out.sources.get(key) == PLANNED:
            continue
        if key.startswith("scheduler.params.") and not job.training.max_steps:
            out.sources[key] = "kept \"auto\": transformers sets it at start (steps of the epochs)"
            continue
        out.problems.append(Problem("deepspeed.config", f"{key}: \"auto\" in {out.sources.get(key)} is "
                                    "filled by neither transformers nor mlaunch; give a value"))


def _zero_rules(out: DsConfig) -> None:
    """DeepSpeed's own offload rules, for whatever file the config came from."""
    zero = out.config.get("zero_optimization", {})
    stage = zero.get("stage", 0)
    dev = lambda k: (zero.get(k) or {}).get("device", "none") if isinstance(zero.get(k), dict) else "none"
    if not isinstance(stage, int) or stage not in (0, 1, 2, 3):
        out.problems.append(Problem("deepspeed.config", f"zero_optimization.stage {stage!r}: give 0, 1, 2 or 3"))
        return
    if dev("offload_param") != "none" and stage != 3:
        out.problems.append(Problem("deepspeed.config", f"zero_optimization.offload_param exists only in "
                                    f"ZeRO-3 (stage is {stage}); use offload_optimizer, or stage 3"))
    bucket = zero.get("allgather_bucket_size")
    if stage in (1, 2) and isinstance(bucket, (int, float)) and bucket % 2:
        out.problems.append(Problem("deepspeed.config" if out.sources.get(
            "zero_optimization.allgather_bucket_size", "").startswith("your") else
            "deepspeed.allgather_bucket_size", f"zero_optimization.allgather_bucket_size {json.dumps(bucket)} is odd; "
            "ZeRO-1/2 asserts it is a multiple of 2 (deepspeed/runtime/zero/stage_1_and_2.py)"))
    if dev("offload_optimizer") != "none" and stage < 1:
        out.problems.append(Problem("deepspeed.config", "zero_optimization.offload_optimizer needs ZeRO "
                                    "stage 1, 2 or 3 (stage is 0)"))


def _leaves(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _parent(cfg: dict, key: str, create: bool = False) -> tuple[dict | None, str]:
    *path, name = key.split(".")
    node: Any = cfg
    for part in path:
        if not isinstance(node.get(part), dict):
            if not create:
                return None, name
            node[part] = {}
        node = node[part]
    return node, name


def _get(cfg: dict, key: str) -> Any:
    parent, name = _parent(cfg, key)
    return None if parent is None else parent.get(name)

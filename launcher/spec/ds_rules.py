"""Rules of the `deepspeed:` section: one form, DeepSpeed's offload rules, ms-swift's names,
zero3_init_flag, and (through launcher/spec/deepspeed.py) the resolved config's own problems."""
from __future__ import annotations

from ..errors import Problem


def check_deepspeed(job) -> list[Problem]:
    """DeepSpeed's own rules: optimizer offload needs ZeRO >= 1, parameter offload needs ZeRO-3.

    Offload is optional at every stage: ZeRO-2 without offload is valid and the fastest
    ZeRO-2 (seed 000's claim that ZeRO-2 must offload to CPU is wrong).
    """
    ds = job.deepspeed
    if ds is None:
        return []
    forms = [k for k in ("stage", "config", "name") if getattr(ds, k) is not None]
    if len(forms) != 1:
        return [Problem("deepspeed", "give exactly one of stage (0-3), config (your "
                        "ds_config.json) or name (ms-swift's zero2, zero3, ...)"
                        + (f"; got {' and '.join(forms)}" if forms else ""))]
    p: list[Problem] = []
    if ds.stage is not None and ds.offload_optimizer != "none" and ds.stage < 1:
        p.append(Problem("deepspeed.offload_optimizer",
                         f"{ds.offload_optimizer} offload needs ZeRO stage 1, 2 or 3 (stage is 0)"))
    if ds.stage is not None and ds.offload_param != "none" and ds.stage != 3:
        p.append(Problem("deepspeed.offload_param",
                         f"parameter offload exists only in ZeRO-3 (stage is {ds.stage}); "
                         "use offload_optimizer, or stage 3"))
    if "nvme" in (ds.offload_optimizer, ds.offload_param) and not ds.nvme_path:
        p.append(Problem("deepspeed.nvme_path", "required when offloading to nvme: add e.g. "
                         "`nvme_path: /local_nvme` under deepspeed (a local NVMe mount on every "
                         "node), or offload to cpu instead"))
    p += _check_zero3_init(job)
    if ds.name is not None:
        p += [Problem(f"deepspeed.{k}", f"not beside name {ds.name}: give stage "
                      f"{_NAME_STAGE[ds.name]} with tuning fields instead, or the name alone")
              for k in sorted(ds.model_fields_set - {"name", "zero3_init_flag"})]
        if job.trainer != "swift":
            p.append(Problem("deepspeed.name", f"{ds.name} is ms-swift's config name; use "
                             f"{{stage: {_NAME_STAGE[ds.name]}}} or config: FILE"))
    return p or _ds_problems(job)


def _check_zero3_init(job) -> list[Problem]:
    """zero3_init_flag: what the HF Trainer does anyway (true under ZeRO-3), or refused."""
    flag = job.deepspeed.zero3_init_flag
    if flag is None or flag == (_ds_stage(job) == 3):
        return []
    if flag:
        return [Problem("deepspeed.zero3_init_flag", "only applies to ZeRO-3 (give stage 3, a "
                        "ZeRO-3 config or name, or remove it)")]
    return [Problem("deepspeed.zero3_init_flag", "false cannot be honoured: under ZeRO-3 the HF "
                    "Trainer (LLaMA-Factory, ms-swift) always loads the model inside "
                    "deepspeed.zero.Init (transformers' is_deepspeed_zero3_enabled reads the stage; "
                    "accelerate's flag is not consulted); remove it, or use ZeRO-2")]


_NAME_STAGE = {"zero0": 0, "zero1": 1, "zero2": 2, "zero3": 3, "zero2_offload": 2, "zero3_offload": 3}


def _ds_problems(job) -> list[Problem]:
    from .deepspeed import build_for
    return build_for(job).problems


def _ds_stage(job) -> int | None:
    """The ZeRO stage the job runs: the spec's, the name's, or the user file's."""
    ds = job.deepspeed
    if ds.stage is not None or ds.name is not None:
        return ds.stage if ds.stage is not None else _NAME_STAGE[ds.name]
    from .deepspeed import build_for
    return build_for(job).stage()


def zero_of(job) -> tuple[int | None, bool, bool]:
    """(ZeRO stage, optimizer offloaded, parameters offloaded) the job runs, whatever form its
    deepspeed section has (stage, ms-swift name or the user's file); (None, False, False) without."""
    ds = getattr(job, "deepspeed", None)
    if ds is None:
        return None, False, False
    if ds.stage is not None:
        return ds.stage, ds.offload_optimizer != "none", ds.offload_param != "none"
    from .deepspeed import build_for
    zero = build_for(job).config.get("zero_optimization", {})
    dev = lambda k: isinstance(zero.get(k), dict) and zero[k].get("device", "none") != "none"
    stage = zero.get("stage", 0)
    return (stage if isinstance(stage, int) else None), dev("offload_optimizer"), dev("offload_param")


# HF Trainer options that configure torch's DistributedDataParallel, which DeepSpeed replaces.
DDP_ONLY = ("ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers")


def ddp_option_notes(job) -> list[str]:
    """A note per DDP-only passthrough option of a DeepSpeed job: accepted (the Trainer takes
    it), but DeepSpeed's engine wraps the model instead of DDP, so it changes nothing."""
    passthrough = getattr(job, "passthrough", None) or {}
    if getattr(job, "deepspeed", None) is None:
        return []
    return [f"passthrough.{k}: configures torch's DDP, which DeepSpeed replaces in this job; "
            "it has no effect (remove it, or drop deepspeed to train with DDP)"
            for k in DDP_ONLY if k in passthrough]

"""Which optimizer a LLaMA-Factory job asks for, and the combinations that cannot build or keep it.

A LLaMA-Factory job picks its optimizer through passthrough: one of LLaMA-Factory's own
(loraplus_lr_ratio, use_galore, use_apollo, use_badam, use_adam_mini, use_muon; built by
llamafactory/train/trainer_utils.py create_custom_optimizer) or transformers' `optim` choice.
mlaunch's ds_config states no optimizer block, so under DeepSpeed the Trainer's own optimizer
is the one DeepSpeed wraps (transformers sets zero_allow_untested_optimizer itself). What is
refused here would otherwise stop every rank at start, or silently run another optimizer.
"""
from __future__ import annotations

from ..errors import Problem
from .ds_rules import zero_of
from .models import LlamaFactoryJob
from .select import world_size

# create_custom_optimizer's order: the first one set builds the optimizer, the rest are ignored.
CUSTOM = {"use_galore": "GaLore", "use_apollo": "APOLLO", "loraplus_lr_ratio": "LoRA+",
          "use_badam": "BAdam", "use_adam_mini": "Adam-mini", "use_muon": "Muon"}
DEFAULT_OPTIM = "adamw_torch"
# The `optim` values LLaMA-Factory's GaLore / APOLLO accept (else NotImplementedError at start).
GALORE_OPTIMS = ("adamw_torch", "adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "adafactor")
APOLLO_OPTIMS = ("adamw_torch",)
# Under ZeRO-Offload accelerate replaces the Trainer's optimizer with DeepSpeed's CPU one
# (accelerate/utils/deepspeed.py map_pytorch_optim_to_deepspeed). These keep their kind
# (AdamW -> CPUAdam in AdamW mode, Adagrad -> CPUAdagrad, 32-bit Lion -> CPULion); any other
# becomes DeepSpeedCPUAdam in plain Adam mode.
OFFLOAD_KEEPS = ("adamw_torch", "adamw_torch_fused", "paged_adamw_32bit", "adagrad", "lion_32bit",
                 "paged_lion_32bit")


def asked_custom(job: LlamaFactoryJob) -> list[str]:
    """The passthrough keys of LLaMA-Factory's own optimizers that are set, in its order."""
    return [k for k in CUSTOM if job.passthrough.get(k) not in (None, False)]


def check_optimizers(job: LlamaFactoryJob) -> list[Problem]:
    """Every optimizer rule of a LLaMA-Factory job."""
    return (_one_custom(job) + _finetuning_type(job) + _optim_used(job) + _transformers_optim(job)
            + _flat_shards(job) + _offload(job))


def _one_custom(job: LlamaFactoryJob) -> list[Problem]:
    custom = asked_custom(job)
    if len(custom) < 2:
        return []
    return [Problem(f"passthrough.{custom[1]}", f"LLaMA-Factory builds one optimizer and takes "
                    f"{CUSTOM[custom[0]]} ({custom[0]}) first, so {CUSTOM[custom[1]]} would be ignored; "
                    f"keep one of {', '.join(custom)}")]


def _finetuning_type(job: LlamaFactoryJob) -> list[Problem]:
    """LLaMA-Factory's FinetuningArguments refuse LoRA with the full-parameter optimizers."""
    if job.finetuning.type != "lora":
        return []
    return [Problem(f"passthrough.{k}", f"LLaMA-Factory cannot use {CUSTOM[k]} with finetuning.type "
                    "lora (it trains the full parameters block by block / by projection); use type full "
                    "or freeze, or remove it")
            for k in ("use_galore", "use_apollo", "use_badam") if job.passthrough.get(k)]


def _optim_used(job: LlamaFactoryJob) -> list[Problem]:
    """An `optim` beside a custom optimizer: ignored (Adam-mini, Muon) or refused (GaLore, APOLLO)."""
    optim = job.passthrough.get("optim", DEFAULT_OPTIM)
    custom = asked_custom(job)
    if optim == DEFAULT_OPTIM or not custom:
        return []
    first = custom[0]
    if first in ("use_adam_mini", "use_muon"):
        return [Problem("passthrough.optim", f"{optim} is ignored: {CUSTOM[first]} ({first}) builds its "
                        "own optimizer; remove optim")]
    allowed = {"use_galore": GALORE_OPTIMS, "use_apollo": APOLLO_OPTIMS}.get(first)
    if allowed and optim not in allowed:
        return [Problem("passthrough.optim", f"{optim} cannot be the base of LLaMA-Factory's "
                        f"{CUSTOM[first]} (it accepts {', '.join(allowed)}); use one of those")]
    return []


def _transformers_optim(job: LlamaFactoryJob) -> list[Problem]:
    """transformers' own GaLore / APOLLO `optim` choices (training_args.OptimizerNames)."""
    optim = str(job.passthrough.get("optim", DEFAULT_OPTIM))
    if not optim.startswith(("galore_", "apollo_")):
        return []
    name = "GaLore" if optim.startswith("galore_") else "APOLLO"
    if job.deepspeed is not None:
        return [Problem("passthrough.optim", f"{optim}: {name} does not work with DeepSpeed (it projects "
                        "2-D gradients; ZeRO hands it flat shards); remove the deepspeed section")]
    if optim.endswith("_layerwise") and world_size(job) > 1:
        return [Problem("passthrough.optim", f"{optim}: transformers refuses layer-wise {name} in "
                        f"distributed runs ({world_size(job)} processes); use {optim[:-len('_layerwise')]}")]
    if not job.passthrough.get("optim_target_modules"):
        return [Problem("passthrough.optim", f"{optim} needs passthrough.optim_target_modules (the "
                        "modules to project, e.g. [attn, mlp]); add it")]
    return []


# What each optimizer needs that ZeRO-1/2/3's flat 1-D shards lack, and how every rank then stops
# at the first step (both reproduced with 2 CPU processes, ZeRO-2 and ZeRO-3).
_NEEDS_2D = {"use_muon": ("LLaMA-Factory's Muon", "orthogonalises whole 2-D weights",
                          "KeyError: 'use_muon'"),
             "use_adam_mini": ("Adam-mini 1.1", "splits each 2-D weight into heads and neurons",
                               "IndexError: too many indices for tensor of dimension 1")}


def _flat_shards(job: LlamaFactoryJob) -> list[Problem]:
    """Optimizers that need the 2-D weights, which ZeRO (stage 1 and up) hands over flattened."""
    stage = zero_of(job)[0]
    if not stage:
        return []
    return [Problem(f"passthrough.{k}", f"{name} cannot run under DeepSpeed ZeRO-{stage}: it {why} and "
                    f"ZeRO gives it flat shards (every rank stops at the first step with {error}); "
                    "remove the deepspeed section (plain DDP)")
            for k, (name, why, error) in _NEEDS_2D.items() if job.passthrough.get(k)]


def _offload(job: LlamaFactoryJob) -> list[Problem]:
    """ZeRO-Offload swaps any other optimizer for DeepSpeedCPUAdam, without a word."""
    _, offload, _ = zero_of(job)
    if not offload:
        return []
    from .deepspeed import build_for
    if build_for(job).config.get("zero_force_ds_cpu_optimizer", True) is False:
        return []       # the user's file lets DeepSpeed step the Trainer's optimizer on CPU
    custom = [k for k in asked_custom(job) if k != "loraplus_lr_ratio"]   # LoRA+ is an AdamW
    optim = job.passthrough.get("optim", DEFAULT_OPTIM)
    if custom:
        asked = f"passthrough.{custom[0]} ({CUSTOM[custom[0]]})"
    elif optim not in OFFLOAD_KEEPS:
        asked = f"passthrough.optim {optim}"
    else:
        return []
    field = "deepspeed.config" if job.deepspeed.config else "deepspeed.offload_optimizer"
    return [Problem(field, f"offloading the optimizer replaces the one {asked} asks for with "
                    "DeepSpeed's CPUAdam (accelerate does so unless zero_force_ds_cpu_optimizer is "
                    "false); remove offload_optimizer, or use a ds_config file with "
                    '"zero_force_ds_cpu_optimizer": false')]

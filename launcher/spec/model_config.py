"""What the spec's rules read of the model itself (its config.json, when readable here) and
the small arithmetic helpers the Megatron and DeepSpeed rules share."""
from __future__ import annotations

import json
import os

# Megatron's lr_decay_style for each spec scheduler it can express.
MEGATRON_SCHEDULERS = {"constant": "constant", "constant_with_warmup": "constant",
                       "linear": "linear", "cosine": "cosine",
                       "inverse_sqrt": "inverse-square-root", "warmup_stable_decay": "WSD"}


def model_config(model: str) -> dict | None:
    """<model>/config.json when the model is a directory readable here, else None (also for a
    FIFO or an oversized file there: spec/inputs.py reads only a bounded regular file)."""
    from ..errors import SpecError
    from .inputs import CONFIG_CAP, read_input
    try:
        cfg = json.loads(read_input(os.path.join(os.path.expanduser(model), "config.json"),
                                    "model config", CONFIG_CAP))
    except (SpecError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


def config_int(cfg: dict | None, key: str) -> int | None:
    """An integer field of a HF config, also looked up in text_config (multimodal models)."""
    for c in (cfg or {}, (cfg or {}).get("text_config") or {}):
        v = c.get(key) if isinstance(c, dict) else None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def divisors(n: int) -> str:
    return ", ".join(map(str, divisor_list(n)))


def divisor_list(n: int) -> list[int]:
    """The divisors of n in ascending order, in O(sqrt(n)) steps (n may be a batch of 2^31)."""
    from math import isqrt
    small = [d for d in range(1, isqrt(n) + 1) if n % d == 0] if n > 0 else []
    return small + [n // d for d in reversed(small) if d * d != n]

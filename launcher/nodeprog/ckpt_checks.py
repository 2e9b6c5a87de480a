"""Is one checkpoint directory complete? The per-layout checks of node program checkpoints:
HF Trainer / LLaMA-Factory weights and trainer_state.json, DeepSpeed's global_step<N>/ engine
state, Megatron-SWIFT's tracker and iter_<N>/ (see checkpoints.py for the layouts).

A part of node program checkpoints (inlined into its shipped text by nodeprog.source):
standard library only, no imports from ``launcher``; it only lists and reads, never writes.
"""
from __future__ import annotations

import json
import os
import stat

TRACKER = "latest_checkpointed_iteration.txt"
# Megatron's dist_checkpointing writes metadata.json after every shard: the completion mark.
MEGATRON_FILES = ("common.pt", "metadata.json")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin",
                "adapter_model.safetensors", "adapter_model.bin")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
NO_WEIGHTS = "no model or adapter weights"
# The most of one JSON or text file read here: a trainer_state.json holds every logged step
# (about 150 bytes each: hundreds of MB after a long run logging every step); a planted link to
# /dev/zero, a FIFO or a sparse giant must not hang or fill memory.
READ_CAP = 1 << 30


def read_capped(path: str, cap: int = READ_CAP) -> bytes:
    """A regular file's bytes (links followed), at most cap of them; OSError for anything else
    (a device, a FIFO: opened without blocking and refused) or a bigger file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError("not a regular file")
        if st.st_size > cap:
            raise OSError("%d bytes, over the %d read here" % (st.st_size, cap))
        return fh.read(cap + 1)[:cap]


def load_json(path: str):
    """json.loads of read_capped(path): OSError or ValueError as json.load gives them."""
    return json.loads(read_capped(path))


def _list_dir(path: str) -> list[str]:
    """Sorted entry names of a directory; empty when missing or unreadable."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _tracked_iteration(ckpt: str) -> int | None:
    try:
        return int(read_capped(os.path.join(ckpt, TRACKER), 64).strip())
    except (OSError, ValueError):
        return None


def check_megatron(ckpt: str, step: int) -> str | None:
    """Why Megatron-SWIFT's ``checkpoint-<step>`` dir cannot be resumed, or None.

    The master writes the tracker after every rank passed the save barrier, and
    dist_checkpointing's metadata.json marks a finished sharded save. With
    ``no_save_optim`` (and safetensors on) only common.pt is written: no weights or
    optimizer in Megatron's format, so nothing to resume from."""
    if _tracked_iteration(ckpt) != step:
        return "no readable %s naming %d (interrupted save?)" % (TRACKER, step)
    it = os.path.join(ckpt, "iter_%07d" % step)
    names = set(_list_dir(it))
    if names and names <= {"common.pt"}:
        return ("iter_%07d/ holds only common.pt: saved with no_save_optim, "
                "not resumable" % step)
    missing = [f for f in MEGATRON_FILES if f not in names]
    if missing:
        return "iter_%07d/ lacks %s (interrupted save?)" % (step, ", ".join(missing))
    return None


def _check_trainer_state(path: str, step: int) -> str | None:
    """Reason trainer_state.json (written last by HF Trainer) is unusable, or None."""
    fname = os.path.join(path, "trainer_state.json")
    if not os.path.isfile(fname):
        return "no trainer_state.json (interrupted save?)"
    try:
        state = load_json(fname)
    except ValueError as e:
        return "trainer_state.json is not valid JSON: %s" % e
    except OSError as e:
        return "cannot read trainer_state.json: %s" % e
    gs = state.get("global_step") if isinstance(state, dict) else None
    if not isinstance(gs, int) or isinstance(gs, bool):
        return "trainer_state.json has no integer global_step"
    if gs != step:
        return "trainer_state.json says global_step %d, expected %d" % (gs, step)
    return None


def _check_index(path: str, index: str) -> str | None:
    """Reason a sharded-weights index is unusable (bad JSON, missing shard), or None."""
    try:
        weight_map = load_json(os.path.join(path, index))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as e:
        return "%s is not a valid index: %s" % (index, e)
    if not shards:
        return "%s lists no shards" % index
    for shard in shards:
        if not os.path.isfile(os.path.join(path, shard)):
            return "shard %s listed in the index is missing" % shard
    return None


def _check_weights(path: str) -> str | None:
    """Reason model/adapter weights are absent or incomplete, or None when present."""
    if any(os.path.isfile(os.path.join(path, w)) for w in WEIGHT_FILES):
        return None
    indexes = [i for i in INDEX_FILES if os.path.isfile(os.path.join(path, i))]
    if not indexes:
        return NO_WEIGHTS
    reasons = [_check_index(path, i) for i in indexes]
    return None if None in reasons else reasons[0]


def _check_deepspeed(path: str, step: int, dp_size: int | None) -> str | None:
    """Reason the DeepSpeed ``global_step<N>/`` engine state is unusable, or None.

    HF resume calls ``engine.load_checkpoint(path)`` with no tag, so DeepSpeed
    reads the tag from the ``latest`` file; when present it must name this
    step. A missing ``latest`` is tolerated (only ``save_latest=False`` omits
    it and the tag dir is then checked directly)."""
    tag = "global_step%d" % step
    latest = os.path.join(path, "latest")
    if os.path.isfile(latest):
        try:
            named = read_capped(latest, 4096).decode("utf-8", "replace").strip()
        except OSError as e:
            return "cannot read DeepSpeed latest file: %s" % e
        if named != tag:
            return "DeepSpeed latest file names %r, expected %r" % (named, tag)
    gdir = os.path.join(path, tag)
    if not os.path.isdir(gdir):
        return "no DeepSpeed %s/ directory" % tag
    names = _list_dir(gdir)
    if not any(n.endswith("model_states.pt") for n in names):
        return "DeepSpeed %s/ has no model states (*model_states.pt)" % tag
    optim = sum(1 for n in names if n.endswith("optim_states.pt"))
    saved = _saving_ranks(path, names)
    # One shard per rank of the world that saved it; with no rank numbers to read, this
    # world's (dp_size). A smaller world's complete checkpoint is complete: the resume at
    # this world converts it (runs/universal.py).
    need = saved or max(dp_size or 1, 1)
    if optim < need:
        return ("DeepSpeed %s/ has %d optimizer shard%s, expected %d"
                " (one per data-parallel rank)" % (tag, optim, "" if optim == 1 else "s", need))
    return None


def _saving_ranks(path: str, names: list[str]) -> int:
    """How many ranks saved this checkpoint: one past the highest rank number on an optimizer
    shard (``zero_pp_rank_<R>_...``) or an rng state (``rng_state_<R>.pth``), 0 when none
    has one. DeepSpeed's save ends in a barrier before any rank writes its rng state or rank
    0 trainer_state.json, so a complete checkpoint's top rank left at least its shard: a
    missing shard below the top is a gap, never a smaller world."""
    top = -1
    for n in names:
        if n.endswith("optim_states.pt") and "zero_pp_rank_" in n:
            digits = n.split("zero_pp_rank_", 1)[1].split("_", 1)[0]
            top = max(top, int(digits)) if digits.isdigit() else top
    for n in _list_dir(path):
        if n.startswith("rng_state_") and n.endswith(".pth") and n[10:-4].isdigit():
            top = max(top, int(n[10:-4]))
    return top + 1


def check_checkpoint(path: str, step: int, *, deepspeed: bool = False,
                     dp_size: int | None = None) -> str | None:
    """Why checkpoint-``step`` at ``path`` is incomplete, or None when usable.

    HF Trainer with DeepSpeed calls ``engine.save_checkpoint`` inside
    ``save_model``; under ZeRO-3 without ``stage3_gather_16bit_weights_on_model_save``
    it writes no model.safetensors at all (weights live only in the
    ``global_step<N>/`` model states, recoverable with zero_to_fp32.py), and
    resume loads from that dir. So with DeepSpeed a valid global_step dir
    stands in for absent weights files; a sharded index with missing shards is
    still rejected, as that is a half-written checkpoint either way."""
    reason = _check_trainer_state(path, step)
    if reason:
        return reason
    weights = _check_weights(path)
    if deepspeed:
        reason = _check_deepspeed(path, step, dp_size)
        if reason or weights == NO_WEIGHTS:
            return reason
    return weights


def _state_step(path: str) -> int | None:
    try:
        gs = load_json(os.path.join(path, "trainer_state.json")).get("global_step")
    except (OSError, ValueError, AttributeError):
        return None
    return gs if isinstance(gs, int) and not isinstance(gs, bool) else None

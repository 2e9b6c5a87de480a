"""Find the latest *complete* training checkpoint in an output_dir.

Standard library only and no imports from ``launcher``: the launcher ships this
program's text (``nodeprog.source``: this file with its part ckpt_checks.py, the per-layout
completeness checks, inlined) to the remote master node and runs it as ``python3 - OUTPUT_DIR
[--deepspeed] [--dp-size N]``, which prints one JSON object (see ``Discovery``)
and exits 0 even when no checkpoint is complete. Nothing is ever deleted or
modified; the scan only lists directories and reads small JSON/text files.

Layouts: HF Trainer / LLaMA-Factory ``output_dir/checkpoint-<N>``, ms-swift
``output_dir/v<M>-<timestamp>/checkpoint-<N>``, and with ``--megatron``
Megatron-SWIFT 4.x's ``v<M>-<timestamp>/checkpoint-<N>/{latest_checkpointed_iteration.txt,
iter_<NNNNNNN>/}`` (ms-swift 4.6 swift/megatron/trainers/base.py save_checkpoint and
swift/megatron/utils/megatron_lm_utils.py save_mcore_checkpoint): the resumable unit is
the checkpoint-<N> dir, which --mcore_model/--mcore_adapter load through its tracker.

Symlinks: a candidate (checkpoint or version dir) that resolves outside
output_dir is reported as skipped and never used, because resuming from it
would read another run's state; links that stay inside output_dir, and
symlinked files inside a checkpoint (e.g. deduplicated shards), are followed.
Owners: a candidate owned by neither this user nor output_dir's owner is skipped too (another
user's files in a shared output_dir); the JSON and text read are regular files of bounded size.
Returned paths are ``os.path.join(output_dir, ...)`` exactly as given, not made
absolute, since this may run with a different cwd than the training job.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass, field

from .ckpt_checks import (TRACKER, _list_dir, _state_step, _tracked_iteration, check_checkpoint,
                          check_megatron, load_json)

CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
VERSION_RE = re.compile(r"^v(\d+)-")


@dataclass(frozen=True)
class Skipped:
    """A candidate checkpoint newer than the chosen one, and why it was not used."""
    path: str
    name: str  # path relative to output_dir, e.g. "v1-20260101-120000/checkpoint-30"
    reason: str


@dataclass(frozen=True)
class Discovery:
    """Result of a scan: the chosen checkpoint (or None) and what was passed over."""
    latest: str | None
    step: int | None
    skipped: tuple[Skipped, ...]
    found_any: bool
    # "name@mtime" of every candidate seen: a restart of a fresh (--overwrite) launch
    # passes them back as `ignore`, so it never resumes from an older run's checkpoint.
    stamps: tuple[str, ...] = field(default=(), compare=False)
    # The chosen checkpoint's trainer_state.json numbers (global_step, epoch, max_steps,
    # num_train_epochs): whether training had already finished when it was written.
    progress: dict = field(default_factory=dict, compare=False)

    def to_json(self) -> str:
        """Serialise to the JSON object the script mode prints."""
        return json.dumps({
            "latest": self.latest, "step": self.step, "found_any": self.found_any,
            "progress": self.progress,
            "skipped": [{"path": s.path, "name": s.name, "reason": s.reason}
                        for s in self.skipped], "stamps": list(self.stamps)})

    @classmethod
    def from_json(cls, text: str) -> "Discovery":
        """Rebuild a Discovery from ``to_json`` output (e.g. read back over ssh)."""
        d = json.loads(text)
        skipped = tuple(Skipped(s["path"], s["name"], s["reason"])
                        for s in d.get("skipped", []))
        return cls(d.get("latest"), d.get("step"), skipped, bool(d.get("found_any")),
                   tuple(d.get("stamps", ())), dict(d.get("progress") or {}))

    def explain(self) -> list[str]:
        """One human line per skipped checkpoint, saying what is used instead."""
        tail = "using " + _display_name(self.latest) if self.latest else "no complete checkpoint"
        return ["%s: %s — %s" % (s.name, s.reason, tail) for s in self.skipped]


def _display_name(path: str) -> str:
    """Name of a checkpoint path relative to output_dir (keeps a swift version dir)."""
    path = path.rstrip("/" + os.sep)
    parent, base = os.path.split(path)
    pbase = os.path.basename(parent)
    return pbase + "/" + base if VERSION_RE.match(pbase) else base


def _candidates(output_dir: str) -> list[tuple[int, int, str]]:
    """(step, version, relative name) of every checkpoint-like dir, newest first.

    Plain ``checkpoint-N`` gets version -1 so a swift ``v0-*`` dir wins a tie."""
    found = []
    for name in _list_dir(output_dir):
        full = os.path.join(output_dir, name)
        m = CKPT_RE.match(name)
        if m and os.path.isdir(full):
            found.append((int(m.group(1)), -1, name))
        v = VERSION_RE.match(name)
        if v and os.path.isdir(full):
            for sub in _list_dir(full):
                m = CKPT_RE.match(sub)
                if m and os.path.isdir(os.path.join(full, sub)):
                    found.append((int(m.group(1)), int(v.group(1)), name + "/" + sub))
    return sorted(found, reverse=True)


def _megatron_candidates(output_dir: str) -> list[tuple[int, int, str]]:
    """(iteration, version, v<M>-*/checkpoint-<N>) of every Megatron-SWIFT save, newest first.

    The same dirs as HF mode; only the completeness check differs (check_megatron)."""
    return [c for c in _candidates(output_dir) if c[1] >= 0]


def _outside(output_dir: str, path: str) -> bool:
    """True when ``path`` resolves (through symlinks) outside output_dir."""
    root = os.path.realpath(output_dir)
    return os.path.commonpath([root, os.path.realpath(path)]) != root


def _stranger(output_dir: str, path: str) -> int | None:
    """The owner of checkpoint dir path (and of its version dir) where it is neither this user
    nor output_dir's: in a team's shared output_dir another user could plant a newer
    checkpoint-N whose pickles every restart would load. None: owned as it should be."""
    try:
        # root too: a container run as root writes the user's checkpoints as uid 0, and root
        # could rewrite the user's own files anyway
        owners = {os.getuid(), os.stat(output_dir).st_uid, 0}
        rel = os.path.relpath(path, output_dir).split(os.sep)
        for depth in range(1, len(rel) + 1):
            uid = os.stat(os.path.join(output_dir, *rel[:depth])).st_uid
            if uid not in owners:
                return uid
    except OSError:
        return None   # gone meanwhile: the completeness check says so
    return None


def _progress(path: str) -> dict:
    """The schedule numbers of a (complete) checkpoint's trainer_state.json; {} if none."""
    try:
        state = load_json(os.path.join(path, "trainer_state.json"))
    except (OSError, ValueError):
        return {}
    keys = ("global_step", "epoch", "max_steps", "num_train_epochs")
    return {k: state[k] for k in keys if isinstance(state, dict) and isinstance(state.get(k), (int, float))}


def _stamp(output_dir: str, name: str) -> str:
    """name@mtime of the checkpoint's trainer_state.json (else of its dir): changes on re-save."""
    path = os.path.join(output_dir, *name.split("/"))
    for p in (os.path.join(path, "trainer_state.json"), os.path.join(path, TRACKER), path):
        try:
            return "%s@%d" % (name, os.stat(p).st_mtime_ns)
        except OSError:
            pass
    return name


def find_latest_complete(output_dir: str, *, deepspeed: bool = False,
                         dp_size: int | None = None, ignore: frozenset = frozenset(),
                         megatron: bool = False) -> Discovery:
    """Scan output_dir; return the newest complete checkpoint and the newer ones skipped.

    ignore: stamps (see Discovery.stamps) of checkpoints that must not be used.
    """
    cands = _megatron_candidates(output_dir) if megatron else _candidates(output_dir)
    stamps = tuple(_stamp(output_dir, name) for _, _, name in cands)
    skipped = []
    for (step, _version, name), stamp in zip(cands, stamps):
        if stamp in ignore:
            continue
        path = os.path.join(output_dir, *name.split("/"))
        if _outside(output_dir, path):
            reason = "symlink to %s outside output_dir (not followed)" % os.path.realpath(path)
        elif (other := _stranger(output_dir, path)) is not None:
            reason = ("owned by uid %d, neither you, root nor output_dir's owner: another user's files "
                      "are never resumed from (resume from it by name: --resume=PATH)" % other)
        elif megatron:
            reason = check_megatron(path, step)
        else:
            reason = check_checkpoint(path, step, deepspeed=deepspeed, dp_size=dp_size)
        if reason is None:
            return Discovery(path, step, tuple(skipped), True, stamps, _progress(path))
        skipped.append(Skipped(path, name, reason))
    return Discovery(None, None, tuple(skipped), bool(cands), stamps)


def check_explicit(path: str, *, deepspeed: bool = False, dp_size: int | None = None,
                   megatron: bool = False) -> Discovery:
    """The Discovery of one checkpoint the user named (``--resume PATH``): usable or skipped.

    Its step comes from the directory name (checkpoint-N), else from trainer_state.json
    (Megatron: from the run dir's tracker file)."""
    name = os.path.basename(path.rstrip("/" + os.sep)) or path
    if not os.path.isdir(path):
        return Discovery(None, None, (Skipped(path, path, "no such directory"),), False)
    m = CKPT_RE.match(name)
    step = int(m.group(1)) if m else (_tracked_iteration(path) if megatron else _state_step(path))
    if step is None:
        reason = ("no readable %s" % TRACKER if megatron else
                  "not a checkpoint-N directory and no trainer_state.json with a global_step")
    elif megatron:
        reason = check_megatron(path, step)
    else:
        reason = check_checkpoint(path, step, deepspeed=deepspeed, dp_size=dp_size)
    if reason:
        return Discovery(None, None, (Skipped(path, path, reason),), True)
    return Discovery(path, step, (), True)


def has_checkpoints(output_dir: str) -> bool:
    """True when output_dir holds any checkpoint dir at all, complete or not."""
    return bool(_candidates(output_dir))


def main(argv: list[str] | None = None) -> int:
    """Script entry: print the Discovery JSON for OUTPUT_DIR; always exit 0."""
    ap = argparse.ArgumentParser(description="Find the latest complete checkpoint.")
    ap.add_argument("output_dir")
    ap.add_argument("--deepspeed", action="store_true",
                    help="also require the DeepSpeed global_step<N>/ engine state")
    ap.add_argument("--dp-size", type=int, default=None,
                    help="data-parallel world size: optimizer shards required")
    ap.add_argument("--megatron", action="store_true", help="Megatron-SWIFT run dirs")
    ap.add_argument("--ignore-json", default="[]",
                    help="JSON list of stamps (from an earlier scan) not to use")
    ap.add_argument("--checkpoint", default=None,
                    help="check this one checkpoint instead of scanning output_dir")
    args = ap.parse_args(argv)
    if args.checkpoint:
        print(check_explicit(args.checkpoint, deepspeed=args.deepspeed, dp_size=args.dp_size,
                             megatron=args.megatron).to_json())
        return 0
    found = find_latest_complete(args.output_dir, deepspeed=args.deepspeed,
                                 dp_size=args.dp_size,
                                 ignore=frozenset(json.loads(args.ignore_json)),
                                 megatron=args.megatron)
    print(found.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())

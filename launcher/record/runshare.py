"""Which of an output_dir's step records are one run's own, when several runs shared it.

The trainer appends every launch's records to one file (LLaMA-Factory's trainer_log.jsonl; a
resume continues it), so a run's report drew the later run's steps as its own (issue 56: a
run of 8 steps reported "12 / 12" with the resumed run's loss). Each run's own events.jsonl
says when each of its attempts started, from which checkpoint step, and (its `step` events)
some losses the attempt logged: the file's launches (runlog.step_records' segments) are
matched to the attempts of every run in that output_dir, oldest first.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from . import runevents

CKPT_STEP = "checkpoint-"


@dataclass(frozen=True)
class Launch:
    """One attempt of one run that reached its first step: when, from which step, losses seen."""

    started: float          # POSIX time of its first_step event
    run_id: str
    attempt: int
    start_step: int         # the checkpoint step it resumed from (0: a fresh start)
    losses: tuple[float, ...]


def launches(log_dirs: list[str]) -> list[Launch]:
    """Every attempt that reached a first step, of each log dir's run, oldest first."""
    out = []
    for log_dir in log_dirs:
        events = runevents.read(log_dir)
        run_id = os.path.basename(os.path.normpath(log_dir))
        starts = _start_steps(events)
        for e in events:
            if e.get("event") != "first_step" or runevents._t(e) is None:
                continue
            n = e.get("attempt", 0)
            losses = tuple(float(x["loss"]) for x in events if x.get("event") == "step"
                           and x.get("attempt", 0) == n and _finite(x.get("loss")))
            out.append(Launch(runevents._t(e).timestamp(), run_id, n, starts.get(n, 0), losses))
    return sorted(out, key=lambda launch: launch.started)


def resumed_at(log_dirs: list[str]) -> set[int]:
    """The checkpoint steps any attempt of these runs resumed from: a launch boundary."""
    return {s for d in log_dirs for s in _start_steps(runevents.read(d)).values() if s}


def sharing(output_dir: str | None, log_dir: str) -> list[str]:
    """The log dirs of the runs that wrote into output_dir (its logs/<run>/ with events.jsonl),
    this run's own included wherever it lies."""
    found = {os.path.normpath(log_dir)}
    under = os.path.join(output_dir, "logs") if output_dir else None
    if under and os.path.isdir(under):
        for name in os.listdir(under):
            path = os.path.join(under, name)
            if os.path.isfile(os.path.join(path, "events.jsonl")):
                found.add(os.path.normpath(path))
    return sorted(found)


def own_segments(segments: list[tuple[int, list]], runs: list[Launch], run_id: str) -> dict[int, int]:
    """{segment: attempt} of run_id's own launches. segments: (id, its steps) in file order,
    each step with .step and .loss. A launch takes the first unclaimed segment after the last
    one claimed that starts at or past its resume step (transformers 5.6 logs the resumed step
    again) and holds a loss it logged (when it logged one)."""
    out: dict[int, int] = {}
    at = 0
    for launch in runs:
        for j in range(at, len(segments)):
            seg, steps = segments[j]
            if steps and steps[0].step >= launch.start_step and _holds(steps, launch.losses):
                if launch.run_id == run_id:
                    out[seg] = launch.attempt
                at = j + 1
                break
    return out


def _holds(steps: list, losses: tuple[float, ...]) -> bool:
    if not losses:
        return True
    have = [s.loss for s in steps if s.loss is not None]
    return any(math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-4) for a in losses for b in have)


def _start_steps(events: list[dict]) -> dict[int, int]:
    """attempt -> the checkpoint step it resumed from (run_start's resume_from, a restart's)."""
    out = {}
    for e in events:
        if e.get("event") in ("run_start", "restart"):
            step = checkpoint_step(e.get("resume_from"))
            out[e.get("attempt", 0)] = step or 0
    return out


def checkpoint_step(path) -> int | None:
    """The step of a checkpoint path (…/checkpoint-12 -> 12), else None."""
    name = os.path.basename(str(path or "").rstrip("/"))
    tail = name[len(CKPT_STEP):] if name.startswith(CKPT_STEP) else ""
    return int(tail) if tail.isascii() and tail.isdigit() else None


def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False

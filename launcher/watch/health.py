"""Run health: reading progress from the ranks' output, and deciding when a run is unwell.

Pure: it is fed lines and clock ticks and answers with events; the job session acts on them
(stack dumps, teardown). Progress is a new training step. What counts as a step is the
trainer's word, given by the readers below:

* Hugging Face Trainer (LLaMA-Factory, ms-swift): rank 0 prints one dict per logging step,
  ``{'loss': 5.99, 'grad_norm': 0.53, 'learning_rate': 0.001, 'epoch': 0.06}``; ms-swift adds
  ``'global_step/max_steps': '5/10'``. tqdm's bar, ``  3/8 [00:01<00:02, ...]``, carries the
  step between logging steps (mlaunch keeps a frame of it every few seconds).
* Script jobs: a JSON object per line with a "step" key, ``{"step": 3, "loss": 0.25}``, or the
  same dict form as the Trainer's.

The world-size check reads only the anchored lines of WORLD_LINES, and stops a run only on a
second source: two distinct lines (two ranks, or a rank and its node's torchrun) that each
state a world other than the plan's. The first is recorded as a ``world_size_suspect`` event.
Two lines, not the node's WORLD_SIZE: the launcher never sees the ranks' environment (torchrun
sets WORLD_SIZE in its workers only), and a wrong world shows in every rank that joined it.
"""
from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import pyparse
from .world_lines import TEE_PREFIX, read_world_size, whole_line  # noqa: F401 (read_world_size: API)

DICT_LINE = re.compile(r"(\{['\"](?:loss|step|train_loss|eval_loss)['\"].*\})\s*$")
# The Trainer's bar has no description (ms-swift's says "Train:"); data preprocessing bars ("Running tokenizer on
# dataset: 100%|...| 64/64") do, and are not training steps.
TQDM_STEP = re.compile(r"^(?:\[[A-Za-z_]*\d+\]:)?(?:Train:)?\s*\d+%\|[^|]*\|\s*(\d+)/(\d+) \[\d")
SAVING = re.compile(r"Saving model checkpoint to (\S+)")


@dataclass(frozen=True)
class Step:
    """One progress record seen in a rank's output."""

    step: int | None
    loss: float | None = None
    grad_norm: float | None = None
    lr: float | None = None
    total: int | None = None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value)  # 'nan', 'inf' and numbers written as strings
    except (TypeError, ValueError):
        return None


def _parse_dict(text: str) -> dict | None:
    for parse in (json.loads, pyparse.literal_eval):
        try:
            value = parse(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    # Python's repr prints nan/inf bare, which neither parser takes.
    fixed = re.sub(r"(?<=[:\s])(-?)(nan|inf)(?=[,}\s])", r"'\1\2'", text)
    try:
        value = pyparse.literal_eval(fixed)
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, dict) else None


# may_matter()'s fixed parts: a line with none of them means nothing to the watch (the node
# relay, nodeprog/relay.py, copies to the launcher only lines with one of them)
MARKS = ("world", "{", "%|", "Saving model checkpoint")


def may_matter(text: str) -> bool:
    """Whether text holds what a world-size line, a save, a dict or a tqdm step needs (each
    pattern's fixed part): one scan of a chunk spares a flood of plain lines every regex.
    One character first, each time: a memchr, much faster than a longer search
    (bench/results/logpath-*)."""
    return (("w" in text and "world" in text) or "{" in text or ("|" in text and "%|" in text)
            or ("S" in text and "Saving model checkpoint" in text))


def read_step(line: str) -> Step | None:
    """The progress record in one output line, or None (any trainer; see module doc)."""
    m = DICT_LINE.search(line)
    if m:
        d = _parse_dict(m.group(1))
        if d is not None and ("loss" in d or "step" in d):
            return _from_dict(d)
    m = TQDM_STEP.search(line)
    # "0/8" is the bar drawn before the first step: not progress yet.
    if m and int(m.group(1)) > 0 and int(m.group(2)) > 0:
        return Step(step=int(m.group(1)), total=int(m.group(2)))
    return None


def _from_dict(d: dict) -> Step:
    step, total = d.get("step"), None
    if isinstance(d.get("global_step/max_steps"), str) and "/" in d["global_step/max_steps"]:
        a, _, b = d["global_step/max_steps"].partition("/")
        step, total = int(a) if a.isdigit() else None, int(b) if b.isdigit() else None
    return Step(step=int(step) if isinstance(step, (int, float)) else None,
                loss=_number(d.get("loss")), grad_norm=_number(d.get("grad_norm")),
                lr=_number(d.get("learning_rate", d.get("lr"))), total=total)



@dataclass
class Verdict:
    """What the monitor concluded: an event to record, and whether the run must stop."""

    event: str
    fields: dict[str, Any]
    stop: bool = False
    restartable: bool = False
    message: str = ""


@dataclass
class HealthConfig:
    """The spec's health section, resolved to numbers."""

    hang_after_s: float | None = None      # None: derived from the observed step time
    startup_after_s: float = 3600.0
    min_hang_s: float = 600.0
    hang_step_factor: float = 20.0
    nan_patience: int = 3
    zero_loss_patience: int = 0            # 0: off
    check_world_size: bool = True
    log_every: int = 10


@dataclass
class Monitor:
    """Feeds on every rank's lines; tells when the run hangs, diverges or joined wrongly."""

    config: HealthConfig
    expected_world: int
    clock: Callable[[], float]
    started: float = field(default=0.0)
    last_progress: float | None = None
    last_step: int | None = None
    steps_seen: int = 0
    step_times: list[float] = field(default_factory=list)
    bad_losses: int = 0
    bad_since: int | None = None    # the step of the first NaN/inf log in the current streak
    zero_losses: int = 0
    last_loss: float | None = None
    saving: str | None = None       # a checkpoint being written: complete once training moves on
    total_steps: int | None = None
    node_steps: dict = field(default_factory=dict)   # node -> (its last step, total): the live view
    wrong_worlds: dict = field(default_factory=dict)  # (node, line) -> (host, world): not the plan's
    _world_stopped: bool = False
    _hung: bool = False

    def __post_init__(self) -> None:
        self.started = self.clock()

    def lines(self, node: int, host: str, lines: list[str]) -> list[Verdict]:
        """Verdicts from one node's new lines, in order."""
        out: list[Verdict] = []
        if not may_matter("\n".join(lines)):
            return out
        for line in map(whole_line, lines):
            out += self._world(node, host, line)
            saving = SAVING.search(line)
            if saving:
                out += self.finish()
                self.saving = saving.group(1).rstrip(".")
            step = read_step(line)
            if step is not None:
                if step.step is not None:
                    self.total_steps = step.total or self.total_steps
                    self.node_steps[node] = (step.step, step.total or self.total_steps)
                out += self._progress(step)
        return out

    def finish(self) -> list[Verdict]:
        """The checkpoint event of a save that training has moved past (or that ended the run)."""
        if self.saving is None:
            return []
        path, self.saving = self.saving, None
        return [Verdict("checkpoint", {"path": path, "step": self.last_step})]

    def tick(self) -> list[Verdict]:
        """A hang verdict once no progress has landed for too long (checked periodically)."""
        if self._hung:
            return []
        now = self.clock()
        if self.last_progress is None:
            limit, since, phase = self.config.startup_after_s, self.started, "startup"
        else:
            limit, since, phase = self.hang_limit(), self.last_progress, "step"
        if now - since < limit:
            return []
        self._hung = True
        where = "before the first step" if phase == "startup" else f"after step {self.last_step}"
        return [Verdict("hang", {"phase": phase, "silent_s": round(now - since, 1),
                                 "limit_s": round(limit, 1), "last_step": self.last_step},
                        stop=True, restartable=True,
                        message=f"no training step for {now - since:.0f}s {where} "
                                f"(limit {limit:.0f}s)")]

    def hang_limit(self) -> float:
        """hang_after_s, or max(min_hang_s, factor x the median step time seen so far)."""
        if self.config.hang_after_s is not None:
            return self.config.hang_after_s
        if not self.step_times:
            return self.config.min_hang_s
        return max(self.config.min_hang_s,
                   self.config.hang_step_factor * statistics.median(self.step_times))

    def _world(self, node: int, host: str, line: str) -> list[Verdict]:
        """A wrong world stops the run only once two lines say so (module doc: second source)."""
        if not self.config.check_world_size:
            return []
        world = read_world_size(line)
        if world is None or world == self.expected_world:
            return []
        key = (node, TEE_PREFIX.sub("", line.strip(), count=1))
        if key in self.wrong_worlds or self._world_stopped:
            return []
        self.wrong_worlds[key] = (host, world)
        fields = {"node": node, "host": host, "world_size": world, "expected": self.expected_world}
        if len(self.wrong_worlds) < 2:
            # One line may be a stray print; record it, act on a second one.
            return [Verdict("world_size_suspect", {**fields, "line": key[1][:200]})]
        self._world_stopped = True
        seen = sorted({f"node{n} {h}: {w}" for (n, _), (h, w) in self.wrong_worlds.items()})
        return [Verdict("world_size_mismatch", {**fields, "lines": len(self.wrong_worlds)},
                        stop=True,
                        message=f"node{node} {host} joined a world of {world}, the plan has "
                                f"{self.expected_world} ({len(self.wrong_worlds)} lines agree the "
                                f"world is wrong: {'; '.join(seen)}): check that node's "
                                "environment (WORLD_SIZE, torchrun --nnodes) and its trainer "
                                "versions")]

    def _progress(self, step: Step) -> list[Verdict]:
        out: list[Verdict] = []
        advanced = step.step is None and step.loss is not None or (
            step.step is not None and (self.last_step is None or step.step > self.last_step))
        if advanced:
            out += self.finish() + self._advance(step)
        if step.loss is not None or step.grad_norm is not None:
            out += self._values(step)
        return out

    def _advance(self, step: Step) -> list[Verdict]:
        now = self.clock()
        first = self.last_progress is None
        if not first and step.step is not None and self.last_step is not None:
            self.step_times.append((now - self.last_progress) / (step.step - self.last_step))
            self.step_times = self.step_times[-50:]
        self.last_progress = now
        if step.step is not None:
            self.last_step = step.step
        self.steps_seen += 1
        if first:
            return [Verdict("first_step", {"step": self.last_step,
                                           "startup_s": round(now - self.started, 1)})]
        return []

    def _values(self, step: Step) -> list[Verdict]:
        out = []
        if step.loss is not None:
            self.last_loss = step.loss
            out.append(Verdict("step", {"step": self.last_step, "loss": step.loss,
                                        "grad_norm": step.grad_norm, "lr": step.lr}))
        bad = [(k, v) for k, v in (("loss", step.loss), ("grad_norm", step.grad_norm))
               if v is not None and not math.isfinite(v)]
        self.bad_losses = self.bad_losses + 1 if bad else 0
        self.bad_since = (self.bad_since if self.bad_losses > 1 else self.last_step) if bad else None
        if bad and self.bad_losses >= self.config.nan_patience:
            name, value = bad[0]
            out.append(Verdict("nan", {"step": self.bad_since, "last_step": self.last_step,
                                       name: str(value), "in_a_row": self.bad_losses}, stop=True,
                               message=f"{name} is {value} at step {self.bad_since} "
                                       f"({self.bad_losses} logs in a row, up to step "
                                       f"{self.last_step}): stopping; lower the learning rate, "
                                       "check the data, or use bf16 over fp16"))
        out += self._zero(step)
        return out

    def _zero(self, step: Step) -> list[Verdict]:
        patience = self.config.zero_loss_patience
        self.zero_losses = self.zero_losses + 1 if step.loss == 0.0 else 0
        if not patience or self.zero_losses < patience:
            return []
        return [Verdict("nan", {"step": self.last_step, "loss": 0.0, "in_a_row": self.zero_losses},
                        stop=True, message=f"loss is exactly 0.0 for {self.zero_losses} logs in a "
                                           f"row at step {self.last_step}: stopping (labels all "
                                           "masked? check the template and cutoff_len)")]


EFFECTIVELY_INFINITE_S = 7 * 24 * 3600   # a week: no real collective takes that long


def timeout_notice(job: Any) -> str | None:
    """One line when the collective timeout cannot end a hang: then mlaunch's watchdog must."""
    from ..render import ddp_timeout
    timeout = ddp_timeout(job)
    if timeout is None or timeout < EFFECTIVELY_INFINITE_S:
        return None
    h = job.health
    guard = ("the hang watchdog (health.hang_after_s) is then the only guard" if h.enabled else
             "and health.enabled is false, so nothing ends a hung collective; set "
             "training.ddp_timeout or enable health")
    return (f"note: ddp_timeout is {timeout} s ({timeout / 86400:.0f} days): NCCL's own watchdog "
            f"will not end a hung collective; {guard}")

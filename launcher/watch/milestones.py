"""The start-up stages a node's lines tell of: rendezvous done (a world line), data ready,
model loaded, trainer set up; and, after a restart, back at the step reached before the fault.

Each is a ``phase`` event (launcher/record/phases.py) the first time any node's line says it,
until the first step: later lines of the same kind (an eval, a second dataset) are not start-up.
The lines are each writer's own (tests/data/ holds recorded output of each); a job whose
trainer prints none of them still gets rendezvous from its world line, if any, and first step.
"""
from __future__ import annotations

import re

from .world_lines import read_world_size

# (mark: a fixed part the node relay copies lines by, the stage that line closes)
LINES = (
    ("training example:", "data"),              # LLaMA-Factory, after its dataset is tokenized
    ("train_dataset: Dataset(", "data"),        # ms-swift
    ("|| all params: ", "model"),               # LLaMA-Factory: "trainable params: N || all params: M"
    ("model_info: ModelInfo(", "model"),        # ms-swift
    ("***** Running training *****", "trainer setup"),   # Hugging Face Trainer.train()
)
MARKS = tuple(m for m, _ in LINES)
_ANY = re.compile("|".join(re.escape(m) for m in MARKS))


def may_matter(text: str) -> bool:
    """Whether a text may hold one of the start-up lines (one scan)."""
    return "*" in text or "|" in text or "example" in text or "Dataset(" in text or "ModelInfo(" in text


class Milestones:
    """One attempt's start-up stages as they are seen; emit(phase=..., done=...) records each."""

    def __init__(self, emit, reached: int | None = None):
        """reached: the step the run had reached before this attempt (None: a first attempt)."""
        self.emit, self.reached = emit, reached
        self.done: set[str] = set()
        self.training = False
        self.caught = True   # at or past `reached` (a first attempt: always)

    def lines(self, lines: list[str]) -> None:
        """A node's new lines, before the first step."""
        if self.training:
            return
        for line in lines:
            if "rendezvous" not in self.done and read_world_size(line) is not None:
                self._mark("rendezvous")
            m = _ANY.search(line)
            if m:
                done = dict(LINES)[m.group(0)]
                if done not in self.done:
                    self._mark(done)

    def step(self, step: int | None, first: bool, at: str | None = None) -> None:
        """A training step was seen (first: the attempt's first; at: the time of its
        first_step event, which the first step's phase ends at)."""
        if first:
            self.training = True
            behind = self.reached is not None and step is not None and step < self.reached
            self.emit(phase="catch-up" if behind else "training", done="first step", step=step,
                      reached=self.reached if behind else None, **({"at": at} if at else {}))
            self.caught = not behind
        elif not self.caught and step is not None and step >= self.reached:
            self.caught = True
            self.emit(phase="training", done="catch-up", step=step)

    def _mark(self, done: str) -> None:
        self.done.add(done)
        self.emit(phase="loading", done=done)

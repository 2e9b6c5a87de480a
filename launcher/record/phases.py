"""Where a run's time went: its phase timeline, attempt by attempt, read from events.jsonl.

A ``phase`` event marks the moment its ``phase`` begins on its attempt; that phase lasts until
the next phase event of the run (or run_end, or now). Some phase events also say which stage
of the trainer's start-up just finished (``done``: "rendezvous", "data", "model", "trainer
setup", "first step"): the interval that one closes is named after it, since what the nodes
were doing is known only once their line says it (LLaMA-Factory loads its data before its
model, ms-swift the other way round). While a phase lasts it carries the name it began with
(``mlaunch ps RUN``: "rendezvous 41 s").

A fresh attempt: connect, staging (the spec's `staging:` copies and tokenize_once, when it
asks for any), preflight, checkpoint (finding the resume point), stage, start
(every node's session), rendezvous, then what the nodes' lines tell (data, model, trainer
setup, first step), then training. A restart: teardown (from the failure seen) and settle
(every node reports) close the failed attempt; the next one begins with backoff, decide (a
spare in, a shrink, or a reconnect), staging (a spare's copies), checkpoint (found, converted),
then as a fresh one, with
catch-up from its first step back to the step reached before the fault. Under Slurm, stage
(the run's files written) then queued (sbatch took the job) replace connect to start: the
queue's wait is its own bar, until the allocation runs (rendezvous).

Pure: no file but the one read_events reads; launcher/view/timeline.py draws it.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from .events import utc_now

PHASE = "phase"
TRAINING = "training"
CATCH_UP = "catch-up"
SLOW_FACTOR, SLOW_MIN_S = 2.0, 10.0   # a phase this many times its last run's, and longer than this
# Phases whose length is the job's, not the launcher's (as long as training runs, the steps a
# fault cost, the nodes' own exit): never compared with the previous run's.
OPEN_ENDED = frozenset({TRAINING, CATCH_UP, "settle"})


@dataclass(frozen=True)
class Phase:
    """One interval of one attempt: seconds from the run's first phase, and its length."""

    attempt: int
    name: str
    start_s: float
    seconds: float
    open: bool = False   # still going (no later event closes it)


class Pending:
    """Phase marks made before the run's event log is written (connect, preflight, the resume
    point): written just after run_start (which stays the log's first line), each with the
    time it was made, so that a refused submit leaves no events.jsonl."""

    def __init__(self, shown=None) -> None:
        self.marks: list[tuple[str, str, dict]] = []
        self._shown = shown   # called with [[time, phase], ...] at each mark: `ps RUN` shows them meanwhile

    def mark(self, phase: str, **fields) -> None:
        self.marks.append((utc_now(), phase, fields))
        if self._shown is not None:
            self._shown([[at, name] for at, name, _ in self.marks])

    def flush(self, events) -> None:
        for at, phase, fields in self.marks:
            events.emit(PHASE, at=at, phase=phase, **fields)
        self.marks = []


def pending_events(marks: list | None) -> list[dict]:
    """A run's pending marks (the registry's [time, phase] pairs) as the phase events of its
    first attempt: what `ps RUN` reads before events.jsonl holds any."""
    return [{"event": PHASE, "time": at, "phase": name, "attempt": 0} for at, name in marks or ()
            if isinstance(at, str) and isinstance(name, str)]


def now() -> datetime:
    return datetime.now(timezone.utc)


def _t(e: dict) -> datetime | None:
    """An event's time; None without a readable one, or without a zone (a hand-edited or
    damaged line: it cannot be placed against the others)."""
    try:
        t = datetime.fromisoformat(str(e["time"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return None
    return t if t.tzinfo is not None else None


def _attempt(e: dict) -> int:
    """An event's attempt number (0 where a damaged line has none usable)."""
    try:
        return int(e.get("attempt") or 0)
    except (TypeError, ValueError):
        return 0


def timeline(events: list[dict], now: datetime | None = None) -> list[Phase]:
    """Every phase of the run, in order. The last one ends at run_end; without one (a run
    still going) at `now`, marked open (None: at the last event, for a run read afterwards)."""
    marks = sorted(((t, i, e) for i, e in enumerate(events) if e.get("event") == PHASE and (t := _t(e))),
                   key=lambda m: (m[0], m[1]))   # by time: the pre-start marks follow run_start
    marks = [(t, e) for t, _, e in marks]
    if not marks:
        return []
    origin = marks[0][0]
    end = next((t for e in events if e.get("event") == "run_end" and (t := _t(e))), None)
    last = max((t for e in events if (t := _t(e))), default=origin)
    out = []
    for i, (t, e) in enumerate(marks):
        nxt = marks[i + 1] if i + 1 < len(marks) else None
        if nxt is not None:
            stop, name, still = nxt[0], nxt[1].get("done") or e.get("phase"), False
        else:
            stop = end or now or last
            name, still = e.get("phase"), end is None and now is not None
        out.append(Phase(_attempt(e), str(name), (t - origin).total_seconds(),
                         max(0.0, (stop - t).total_seconds()), still))
    return out


def of_attempt(phases: list[Phase], attempt: int) -> list[Phase]:
    return [p for p in phases if p.attempt == attempt]


def current(events: list[dict], now: datetime) -> Phase | None:
    """The phase going on now, None when the run has ended or marked none."""
    phases = timeline(events, now)
    return phases[-1] if phases and phases[-1].open else None


def stored(phases: list[Phase]) -> list[list]:
    """An attempt's phases as the registry keeps them: [name, start s, seconds]."""
    return [[p.name, round(p.start_s, 3), round(p.seconds, 3)] for p in phases]


def reached_before(events: list[dict], attempt: int) -> int | None:
    """The step the run had reached before attempt `attempt` began (its backoff mark's
    `reached`): where that attempt's catch-up ends."""
    for e in events:
        if e.get("event") == PHASE and e.get("attempt") == attempt and e.get("reached") is not None:
            try:
                return int(e["reached"])
            except (TypeError, ValueError):
                return None
    return None


def slow_lines(now: list[tuple[str, float]], before: list[tuple[str, float]], before_id: str) -> list[str]:
    """One warning line per phase that took more than SLOW_FACTOR times as long as the same
    phase of the job's previous run (and more than SLOW_MIN_S): both figures named. `now`
    and `before`: (name, seconds) of the runs' first attempts, an open phase counted so far."""
    had = {}
    for name, s in before:
        had.setdefault(name, s)
    out, seen = [], set()
    for name, s in now:
        if name in seen or name not in had or name in OPEN_ENDED:
            continue
        seen.add(name)
        if s > SLOW_MIN_S and s > SLOW_FACTOR * had[name]:
            out.append(f"warning: {name} took {s:.0f} s, {had[name]:.1f} s in the job's previous "
                       f"run {before_id} (more than {SLOW_FACTOR:g}×)")
    return out


def first_step_s(phases: list[Phase]) -> float | None:
    """Submit to the first step of the first attempt (the end of its "first step" phase)."""
    for p in phases:
        if p.attempt == 0 and p.name == "first step":
            return round(p.start_s + p.seconds, 3)
    return None


def back_to_training_s(phases: list[Phase]) -> dict[int, float]:
    """attempt n (n >= 1) -> seconds from the failure seen (attempt n-1's teardown began)
    until attempt n trains again (its first step; after a catch-up, the step reached before).
    An attempt that failed again before it got there has no figure: it never was back."""
    out = {}
    for p in phases:
        if p.name != "teardown" or p.attempt + 1 not in {q.attempt for q in phases}:
            continue
        mine = [q for q in phases if q.attempt == p.attempt + 1]
        catch = [i for i, q in enumerate(mine) if q.name == CATCH_UP]
        if catch:   # back only once the catch-up ended in training (not in a teardown)
            i = catch[0]
            back = mine[i] if i + 1 < len(mine) and mine[i + 1].name == TRAINING else None
        else:
            back = next((q for q in mine if q.name == "first step"), None)
        if back is not None:
            out[p.attempt + 1] = round(back.start_s + back.seconds - p.start_s, 3)
    return out

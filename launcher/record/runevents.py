"""What the launcher's own events.jsonl says about a run (see launcher/record/events.py): its wall
time, its restarts (reason, checkpoint) and the health events a person should read; and
the JSON-lines reader launcher/record/runlog.py uses for the trainers' logs too."""
from __future__ import annotations

import json
import os
import stat
from datetime import datetime, timezone

# Events worth a line in the report; step/checkpoint/node_* are the plot's or routine.
HEALTH = ("hang", "stacks", "nan", "world_size_suspect", "world_size_mismatch")
# Events that change who runs the job (spare hosts, shrink, a scheduler's exclusions, universal checkpoint).
CHANGES = ("host_replaced", "shrink", "node_excluded", "universal_checkpoint", "hardware_error")


def read(log_dir: str) -> list[dict]:
    """Every whole event line of log_dir/events.jsonl ([] when there is none, a torn last
    line of a run still writing is skipped). A line whose event is not a name or whose attempt
    is not a count is skipped too: a shared output_dir's logs/ holds other users' runs, and one
    planted `"attempt": [1]` made every report of that output_dir fail."""
    return [e for e in jsonl(os.path.join(log_dir, "events.jsonl")) if _well_formed(e)]


def _well_formed(e: dict) -> bool:
    attempt = e.get("attempt", 0)
    return (isinstance(e.get("event"), str) and isinstance(attempt, int) and not isinstance(attempt, bool)
            and attempt >= 0)


def jsonl(path: str) -> list[dict]:
    """Every JSON object line of a file; a torn last line (a run still writing) is skipped."""
    try:   # a FIFO or device planted at path must not hang or flood the reader
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with open(fd, encoding="utf-8", errors="replace") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return []
            lines = fh.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def step_events(events: list[dict]) -> list[tuple[int, float | None, float | None, float | None, int]]:
    """(step, loss, lr, seconds since its attempt's first event, attempt) of each `step` event:
    the step records of a job whose trainer writes no log of its own (a script job)."""
    first: dict[int, datetime] = {}
    out = []
    for e in events:
        t, attempt = _t(e), e.get("attempt", 0)
        if t and attempt not in first and e.get("event") != "phase":   # phases: from connect on
            first[attempt] = t
        if e.get("event") != "step" or not isinstance(e.get("step"), int):
            continue
        loss = e.get("loss")
        loss = float(loss) if isinstance(loss, (int, float, str)) and _number(loss) else None
        elapsed = (t - first[attempt]).total_seconds() if t else None
        out.append((e["step"], loss, e.get("lr"), elapsed, attempt))
    return out


def _number(value) -> bool:
    try:
        float(value)
        return True
    except ValueError:
        return False


def wall_s(events: list[dict]) -> float | None:
    """run_start to run_end (or to the last event of a run still going)."""
    times = {e["event"]: _t(e) for e in events if _t(e)}
    start = times.get("run_start")
    end = times.get("run_end") or max((t for t in (_t(e) for e in events) if t), default=None)
    return (end - start).total_seconds() if start and end else None


def restarts(events: list[dict]) -> dict[int, dict]:
    """attempt -> its restart event (reason, resume_from)."""
    return {e.get("attempt", 0): e for e in events if e["event"] == "restart"}


def first_failure(events: list[dict], attempt: int) -> str | None:
    """How the attempt's first failing node ended, from its node_exit event ("node0: exit 137
    (SIGKILL)", "node1: connection lost"): the cause when no torchrun root-cause block was
    logged (a world of one runs the trainer in-process). None when no node failed."""
    for e in events:
        if e.get("event") != "node_exit" or e.get("attempt") != attempt:
            continue
        if e.get("lost"):
            return f"node{e.get('node')}: connection lost"
        code = e.get("code")
        if isinstance(code, int) and code != 0:
            return f"node{e.get('node')}: exit {code}" + (f" ({_signal_name(code - 128)})"
                                                          if 128 < code < 160 else "")
    return None


def _signal_name(num: int) -> str:
    import signal
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def health_lines(events: list[dict]) -> list[str]:
    """One line per health event: when, which attempt, what, its fields."""
    out = []
    for e in events:
        if e["event"] in HEALTH:
            fields = _fields(e)
            out.append(f"{e.get('time', '?')} attempt {e.get('attempt', 0)}: {e['event']}"
                       + (f" ({fields})" if fields else ""))
    return out


def attempt_lines(events: list[dict]) -> list[str]:
    """The run's membership, attempt by attempt: one line with each attempt's nodes (its
    node_start events) and one per change (a spare in, a shrink with its batch arithmetic, a
    scheduler's exclusion, a checkpoint converted), in order. [] for one attempt and no change."""
    nodes: dict[int, dict] = {}
    out: list[tuple[int, int, str]] = []
    for i, e in enumerate(events):
        attempt = e.get("attempt", 0)
        if e["event"] == "node_start":
            nodes.setdefault(attempt, {})[e.get("node")] = e.get("host")
        elif e["event"] in CHANGES:
            out.append((attempt, i, f"attempt {attempt}: {e['event']} ({_fields(e)})"))
    if len(nodes) < 2 and not out:
        return []
    for attempt, hosts in nodes.items():
        listed = ", ".join(f"node{k} {h}" for k, h in sorted(hosts.items(), key=lambda kv: str(kv[0])))
        out.append((attempt, -1, f"attempt {attempt}: {len(hosts)} nodes: {listed}"))
    return [line for _, _, line in sorted(out)]


def copies_lines(events: list[dict], last: int = 3) -> list[str]:
    """Where the newest checkpoints have copies (checkpoint_copies events of `checkpoints:
    {replicas: N}`): one line per checkpoint, each part and the hosts that hold it."""
    rows = [e for e in events if e.get("event") == "checkpoint_copies"]
    return [f"{e['checkpoint']}: " + "; ".join(f"part{p} on {', '.join(h)}" for p, h in
                                             sorted(e.get("parts", {}).items(), key=lambda x: int(x[0])))
            for e in rows[-last:]]


def _fields(e: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in e.items() if k not in ("time", "run_id", "attempt", "event"))


def _t(e: dict) -> datetime | None:
    """The event's time, in UTC where it names no zone (mlaunch writes Z; a time without one,
    year 1 say, made .timestamp() raise in every report of the output_dir)."""
    try:
        t = datetime.fromisoformat(str(e["time"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)

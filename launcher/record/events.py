"""The run's event log: logs/<run>/events.jsonl, one JSON object per line.

Every line has ``time`` (UTC, ISO 8601 with milliseconds), ``run_id``, ``attempt`` and
``event``, then the event's own fields. Lines are written whole and flushed at once, so
``tail -f | jq`` and log shippers (Fluentd, Vector) can read it while the run goes on.
"""
from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from typing import Any

from . import fsmode

EVENTS = ("run_start", "node_start", "first_step", "step", "checkpoint", "hang", "stacks", "nan",
          "world_size_suspect", "world_size_mismatch", "node_exit", "teardown", "restart",
          "run_end", "gpu_sample", "stop", "host_replaced", "shrink", "node_excluded",
          "hardware_error", "universal_checkpoint", "spare_unreachable", "checkpoint_copies", "checkpoints_set_aside", "phase")


def utc_now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


class EventLog:
    """Appends events of one run to its events.jsonl; safe to call from any thread."""

    def __init__(self, path: str, run_id: str, attempt: int = 0):
        self.path, self.run_id, self.attempt = path, run_id, attempt
        self._lock = threading.Lock()
        fsmode.private_dir(os.path.dirname(path) or ".")

    def emit(self, event: str, at: str | None = None, **fields: Any) -> None:
        """Write one event line (at: its time, utc_now()'s form, when it happened earlier)."""
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}")
        record = {"time": at or utc_now(), "run_id": self.run_id, "attempt": self.attempt,
                  "event": event, **{k: _plain(v) for k, v in fields.items() if v is not None}}
        line = json.dumps(record, default=str, allow_nan=False) + "\n"
        with self._lock:
            try:
                self._append(line)
            except OSError as e:  # the record is lost, the run is not: say so once per file
                _say_once(self.path, f"mlaunch: cannot record events in {self.path} "
                                     f"({e.strerror or e}); the run goes on without them")

    def _append(self, line: str) -> None:
        try:
            f = fsmode.open_private(self.path, "a")
        except FileNotFoundError:  # the log directory was removed meanwhile: make it again
            fsmode.private_dir(os.path.dirname(self.path) or ".")
            f = fsmode.open_private(self.path, "a")
            said_removed(os.path.dirname(self.path) or ".")
        with f:
            f.write(line)


_SAID: set[str] = set()


def said_removed(log_dir: str) -> None:
    """The one line for a log directory removed during the run and made again."""
    _say_once(log_dir, f"mlaunch: {log_dir} was removed during the run; made it again for "
                       "the node logs and events from here on")


def _say_once(path: str, line: str) -> None:
    # One line per events file, however many events fail, on stderr: the console's own
    # stream may be the thing that is broken.
    if path not in _SAID:
        _SAID.add(path)
        print(line, file=sys.stderr, flush=True)


def _plain(value: Any) -> Any:
    # JSON has no NaN or Infinity: a diverged loss is recorded as the string "nan"/"inf".
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def read_events(path: str) -> list[dict]:
    """Every event of an events.jsonl file, in order."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]

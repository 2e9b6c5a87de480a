"""How loaded this machine is, measured once per test session, and the wait limits derived
from it: a test waits on an event (a line, a file, a state, a process gone), and only the
ceiling of that wait, never the pass or fail, depends on how fast the machine is."""
from __future__ import annotations

import os
import time

ENV = "MLAUNCH_TEST_LOAD_FACTOR"   # set once at session start; xdist workers inherit it
MAX_FACTOR = 8.0                    # a stuck test still fails within 8x its quiet limit
PROBE_S = 0.25                      # wall time of the CPU share probe


def cpu_share_slowdown(probe_s: float = PROBE_S) -> float:
    """Wall time over CPU time of a CPU-bound loop: 1.0 when this process has a core to
    itself, 2.0 when it gets half of one. Needs no constant calibrated on a quiet machine."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall0 < probe_s:
        sum(i * i for i in range(2000))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return wall / max(cpu, 1e-3)


def queue_slowdown() -> float:
    """Runnable processes per core over the last minute (at least 1)."""
    try:
        return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    except OSError:
        return 1.0


def measure() -> float:
    """The session's load factor: the worse of both views, between 1 and MAX_FACTOR.
    The suite's own workers are not running yet when this is measured: the quiet limits
    were chosen with them running, so they are the baseline, not load."""
    factor = max(1.0, cpu_share_slowdown(), queue_slowdown())
    return round(min(factor, MAX_FACTOR), 2)


def load_factor() -> float:
    """The factor measured at session start (conftest.py), or now if none was."""
    try:
        return max(1.0, min(float(os.environ[ENV]), MAX_FACTOR))
    except (KeyError, ValueError):
        os.environ[ENV] = str(measure())
        return float(os.environ[ENV])


def limit(seconds: float) -> float:
    """A wait limit chosen on a quiet machine, stretched by this session's load factor."""
    return seconds * load_factor()

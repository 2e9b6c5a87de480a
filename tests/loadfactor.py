"""How loaded this machine is, measured once per test session, and the wait limits derived
from it (or from the load average when a test asks, if that is higher): a test waits on an
event (a line, a file, a state, a process gone), and only the ceiling of that wait, never
the pass or fail, depends on how fast the machine is."""
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


def with_workers(others: float, workers: int, cores: int) -> float:
    """How much slower the suite's `workers` run beside `others` CPU-bound processes than
    alone: the quiet limits were chosen with the workers running, so they are the baseline.
    2 hogs + 2 workers on 2 cores: 2.0 (each worker gets half the core it had)."""
    return max(1.0, (others + workers) / cores) / max(1.0, workers / cores)


def measure(workers: int = 1) -> float:
    """The session's load factor, between 1 and MAX_FACTOR, before the suite's `workers`
    start: the other runnable processes, from the worse of two views (the probe's CPU share,
    which counts them now; the load average, which also sees those a lone probe would not
    notice), and what they will take from the workers (with_workers)."""
    cores = os.cpu_count() or 1
    slow = cpu_share_slowdown()
    # A probe slowed to 1/s of a core shares the cores with cores*s - 1 others; unslowed,
    # it cannot tell how many fewer than cores - 1 there are: the load average says.
    others = max(cores * slow - 1 if slow > 1.05 else 0.0, _loadavg())
    factor = max(slow, with_workers(others, workers, cores))
    return round(min(max(1.0, factor), MAX_FACTOR), 2)


def _loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def load_factor(workers: int = 1) -> float:
    """The factor measured at session start (conftest.py, with the number of pytest-xdist
    workers about to start), or now if none was."""
    try:
        return max(1.0, min(float(os.environ[ENV]), MAX_FACTOR))
    except (KeyError, ValueError):
        os.environ[ENV] = str(measure(workers))
        return float(os.environ[ENV])


def busy_now() -> float:
    """The load factor as the load average sees it now: the session's factor is measured
    before the workers start, and the suite's own training tests (a dozen ranks each) or
    another job may load the machine later. The suite's workers are the baseline."""
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
    cores = os.cpu_count() or 1
    return min(with_workers(max(0.0, _loadavg() - workers), workers, cores), MAX_FACTOR)


def limit(seconds: float) -> float:
    """A wait limit chosen on a quiet machine, stretched by this session's load factor, or
    by the load now where that is higher (a limit is only a ceiling: a longer one never
    changes a verdict, it only waits longer for a stuck test to fail)."""
    return seconds * max(load_factor(), busy_now())

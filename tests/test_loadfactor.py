"""The suite's load factor (tests/loadfactor.py): wait limits stretch by how much slower the
suite's own workers will run than on the machine the quiet limits were chosen on."""
from __future__ import annotations

import os
import subprocess
import sys

from .loadfactor import measure, with_workers


def test_the_workers_share_of_the_cores_sets_the_factor():
    assert with_workers(0, 2, 2) == 1.0      # the baseline: 2 workers on 2 cores
    assert with_workers(2, 2, 2) == 2.0      # 2 hogs beside them: each worker gets half
    assert with_workers(1, 2, 2) == 1.5
    assert with_workers(1, 1, 2) == 1.0      # a hog on the idle core takes nothing
    assert with_workers(6, 2, 8) == 1.0 and with_workers(14, 2, 8) == 2.0


def test_hogs_beside_the_suite_double_its_limits():
    """One CPU hog per core (the issue's load: two `while True: pass` on 2 cores) makes the
    factor about 2 for 2 workers (the old probe-only factor said 1.28 in such a run)."""
    cores = os.cpu_count() or 1
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        for h in hogs:   # running, not still starting: the probe must meet them
            while open(f"/proc/{h.pid}/stat").read().split(")")[1].split()[0] != "R":
                pass
        assert measure(workers=2) >= 1.8   # 2.0 when the probe gets exactly its fair share
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def test_a_limit_stretches_with_the_load_now(monkeypatch):
    """The session's factor is measured before the workers start; a load that comes later (the
    suite's own training ranks) stretches the limits asked for then."""
    from . import loadfactor
    monkeypatch.setenv(loadfactor.ENV, "1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(loadfactor, "_loadavg", lambda: 2.0)   # the two workers alone
    assert loadfactor.limit(5) == 5
    monkeypatch.setattr(loadfactor, "_loadavg", lambda: 8.0)   # six more runnable
    assert loadfactor.limit(5) == 5 * 4.0
    monkeypatch.setattr(loadfactor, "_loadavg", lambda: 100.0)
    assert loadfactor.limit(5) == 5 * loadfactor.MAX_FACTOR

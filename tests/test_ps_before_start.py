"""`mlaunch ps RUN` names the phase going on before the run's first attempt starts (connect,
staging, preflight, the resume point), which events.jsonl holds only once the run starts: a
real submit on this machine, held in its preflight by a gate in the nodes' interpreter (the
preflight's probes run on it; a probe waits, and the launcher with it, until the gate opens)."""
from __future__ import annotations

import os
import re
import stat
import sys
import time

from launcher.record.registry import Registry

from .helpers import limit, script_job, write_spec
from .runs import Runs

GATE = """#!/bin/sh
# the job's interpreter: every run of it waits for `release` (the first one says `entered`)
mkdir {d}/entered 2>/dev/null
while [ ! -e {d}/release ]; do sleep 0.05; done
exec {py} "$@"
"""


def _gated_python(tmp_path) -> str:
    """cluster.python: the gate, with this Python's torchrun beside it (preflight looks there)."""
    (tmp_path / "bin").mkdir()
    path = tmp_path / "bin" / "python"
    path.write_text(GATE.format(d=tmp_path, py=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    os.symlink(os.path.join(os.path.dirname(sys.executable), "torchrun"), tmp_path / "bin" / "torchrun")
    return str(path)


def _wait(what, cond, timeout: float = 120):
    deadline = time.monotonic() + limit(timeout)
    while not (got := cond()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return got


def test_ps_names_the_preflight_going_on_before_any_node_started(tmp_path):
    runs = Runs(str(tmp_path / "home"))
    spec = script_job(["localhost"], 1, "steps.py", ["1", "0"], str(tmp_path / "out"),
                      python=_gated_python(tmp_path), warm_start=False)   # the probes are the first to run it
    spec["preflight"] = {"check_timeout_s": limit(300)}   # the held probe is not taken for a dead node
    proc = runs.popen("submit", write_spec(tmp_path, spec))
    try:
        _wait("the preflight's first interpreter", lambda: (tmp_path / "entered").exists() or proc.poll() is not None)
        assert proc.poll() is None, proc.communicate()
        reg = Registry(os.path.join(runs.home, "runs.db"))
        run, = reg.runs()
        reg.close()
        r = runs.cli("ps", run.id)
        held = runs.cli("ps", run.id, "--json")
        logged = os.path.exists(os.path.join(run.log_dir, "events.jsonl"))
    finally:
        (tmp_path / "release").touch()
        out, err = proc.communicate(timeout=limit(120))
    assert proc.returncode == 0, out + err
    assert r.returncode == 0, r.stderr
    assert re.search(r"^phase: preflight \d+ s \(attempt 0\)$", r.stdout, re.M), r.stdout
    assert "no node samples yet: no node has started" in r.stdout and "does not exist" not in r.stdout
    assert run.state == "starting" and not logged   # what ps said came from the registry
    assert '"phase: preflight' in held.stdout
    # once the run has started, its events say the same: the connect and preflight marks are there
    after = runs.cli("report", run.id)
    assert after.returncode == 0, after.stderr
    assert "preflight" in after.stdout and "connect" in after.stdout

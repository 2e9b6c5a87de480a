"""The Slurm test cluster itself: real slurmctld and slurmd, jobs land in the right hosts."""
from __future__ import annotations

import os
import re
import time

import pytest

from .loadfactor import limit
from .test_fanout import job_pids

pytestmark = pytest.mark.multihost


def _state(cluster, job: str) -> str:
    out = cluster.run(["scontrol", "show", "job", job], check=False).stdout
    m = re.search(r"JobState=(\w+)", out)
    return m.group(1) if m else "GONE"


def _wait_state(cluster, job: str, states: set[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + limit(timeout)
    while time.monotonic() < deadline:
        state = _state(cluster, job)
        if state in states:
            return state
        time.sleep(0.2)
    raise AssertionError(f"job {job} still {_state(cluster, job)}\n{cluster.logs()}")


def test_a_two_node_job_runs_once_in_each_host(slurm2, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nsrun --ntasks-per-node=1 sh -c "
                      "'echo \"$SLURM_NODEID $(hostname) $(ip -4 -o addr show eth0 | awk \"{print \\$4}\")\"'\n")
    r = slurm2.run(["sbatch", "--parsable", "-N", "2", "-o", str(tmp_path / "out-%j.txt"), str(script)])
    job = r.stdout.strip()
    assert _wait_state(slurm2, job, {"COMPLETED", "FAILED"}) == "COMPLETED"
    lines = sorted(open(tmp_path / f"out-{job}.txt").read().split("\n")[:-1])
    hs = slurm2.hs
    assert lines == [f"{i} {h.name} {h.ip}/24" for i, h in enumerate(hs.hosts)]


def test_scancel_ends_every_job_process_in_every_host(slurm2, tmp_path):
    script = tmp_path / "sleep.sh"
    script.write_text("#!/bin/sh\nsrun --ntasks-per-node=1 sleep 300\n")
    keep = [job_pids(h, set()) for h in slurm2.hs.hosts]   # slurmd itself
    job = slurm2.run(["sbatch", "--parsable", "-N", "2", "-o", os.devnull, str(script)]).stdout.strip()
    _wait_state(slurm2, job, {"RUNNING"})
    deadline = time.monotonic() + limit(30)
    while any(len(job_pids(h, k)) == 0 for h, k in zip(slurm2.hs.hosts, keep)):
        assert time.monotonic() < deadline, "the job's processes never appeared"
        time.sleep(0.2)
    slurm2.run(["scancel", job])
    _wait_state(slurm2, job, {"CANCELLED"})
    deadline = time.monotonic() + limit(30)
    while any(job_pids(h, k) for h, k in zip(slurm2.hs.hosts, keep)):
        assert time.monotonic() < deadline, [job_pids(h, k) for h, k in zip(slurm2.hs.hosts, keep)]
        time.sleep(0.2)

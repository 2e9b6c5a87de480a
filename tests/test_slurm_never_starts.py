"""A Slurm job that can never start is reported with Slurm's reason at once (issue 31)."""
from __future__ import annotations

import re

import pytest

from .slurmjobs import slurm_script_job, submit

pytestmark = pytest.mark.multihost


def test_job_that_can_never_start_is_reported_with_slurms_reason(slurm2, tmp_path):
    """cpus-per-task 64 on nodes of 4 CPUs: squeue's reason is PartitionConfig; mlaunch says so,
    takes the job out of the queue, shows no exit code for nodes that never ran, exits 2."""
    spec = slurm_script_job(tmp_path, "allreduce.py", [])
    spec["cluster"]["slurm"]["extra_sbatch"] = {"cpus-per-task": 64}
    spec["max_restarts"] = 2          # it would only happen again: no restart
    r = submit(slurm2, tmp_path, spec, timeout=120)
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr
    m = re.search(r"^\[mlaunch\] slurm job (\d+) can never start: Slurm's reason (\w+): (.*)$",
                  r.stdout, re.M)
    assert m, r.stdout[-3000:]
    assert m.group(2) == "PartitionConfig"
    assert "fix cluster.slurm (partition, nodes, extra_sbatch such as cpus-per-task" in m.group(3)
    assert "(partition debug: 2-2 nodes, 128 CPUs requested)" in m.group(3)
    assert "restart 1/" not in r.stdout and "interrupted" not in r.stdout
    assert re.search(r"^\[mlaunch\] job \S+ failed \(exit 2\)", r.stdout, re.M), r.stdout[-2000:]
    rows = re.findall(r"^\[mlaunch\] ([01]) +\S+ +(.*)$", r.stdout, re.M)
    assert [row[1] for row in rows] == ["not started", "not started"], r.stdout[-2000:]
    assert not re.search(r"\bexit 143\b", r.stdout)
    assert slurm2.run(["squeue", "-h"]).stdout.strip() == ""

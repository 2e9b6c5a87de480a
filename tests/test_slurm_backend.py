"""The Slurm backend on a real slurmctld + slurmd cluster (tests/hostkit/slurm.py)."""
from __future__ import annotations

import glob
import os
import re

import pytest

from .slurmjobs import baseline, leftovers, slurm_script_job, submit

pytestmark = pytest.mark.multihost


def test_allreduce_2x2_through_sbatch(slurm2, tmp_path):
    keep = baseline(slurm2)
    spec = slurm_script_job(tmp_path, "allreduce.py", [])
    r = submit(slurm2, tmp_path, spec)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    sums = re.findall(r"rank (\d+)/4 node (\d) sum (\d+) expected 6", r.stdout)
    assert sorted(int(s[0]) for s in sums) == [0, 1, 2, 3] and all(s[2] == "6" for s in sums), r.stdout
    names = [h.name for h in slurm2.hs.hosts]
    for k, name in enumerate(names):   # each line prefixed with its node and allocated host
        assert re.search(rf"^\[node{k} {name} local[01]\] rank \d/4 node {k} sum 6", r.stdout, re.M), r.stdout
    logs = sorted(glob.glob(str(tmp_path / "out" / "logs" / "*" / "node*.log")))
    assert [os.path.basename(p) for p in logs] == [f"node{k}-{n}.log" for k, n in enumerate(names)]
    for k, path in enumerate(logs):
        assert len(re.findall(rf"rank \d/4 node {k} sum 6", open(path).read())) == 2
    assert leftovers(slurm2, keep) == {n: set() for n in names}

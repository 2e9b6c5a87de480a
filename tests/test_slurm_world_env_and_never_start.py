"""Issue 31 on a real slurmctld: a job that can never start, torchrun at INFO with the world-size
check, cluster.env references and cluster.setup."""
from __future__ import annotations

import glob
import json
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


INFO_ENV = {"LOGLEVEL": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}


def _events(tmp_path) -> list[str]:
    from launcher.record.events import read_events
    (path,) = glob.glob(str(tmp_path / "out" / "logs" / "*" / "events.jsonl"))
    return [e["event"] for e in read_events(path)]


def test_slurm_job_with_torchrun_at_info_runs_to_completion_with_the_check_on(slurm2, tmp_path):
    spec = slurm_script_job(tmp_path, "health_job.py", ["--steps", "4", "--step-s", "0.1"],
                            env=dict(INFO_ENV))
    spec["health"] = {"world_size_check": True}
    r = submit(slurm2, tmp_path, spec)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "group_world_size=2" in r.stdout and "global_world_sizes=[4, 4]" in r.stdout
    assert not [e for e in _events(tmp_path) if e.startswith("world_size")]


def test_slurm_wrong_world_is_still_caught(slurm2, tmp_path):
    spec = slurm_script_job(tmp_path, "health_job.py",
                            ["--steps", "200", "--lie-world", "3", "--lie-node", "1"], env=dict(INFO_ENV))
    r = submit(slurm2, tmp_path, spec)
    assert r.returncode == 78, r.stdout[-3000:] + r.stderr
    assert re.search(r"health: world_size_mismatch: node1 \S+ joined a world of 3, the plan has 4 "
                     r"\(2 lines agree", r.stdout), r.stdout[-3000:]
    assert "step': 200" not in r.stdout
    assert slurm2.run(["squeue", "-h"]).stdout.strip() == ""


def test_slurm_ranks_see_expanded_env_and_setup(slurm2, tmp_path):
    spec = slurm_script_job(tmp_path, "env_job.py", [], nproc=1,
                            env={"MLAUNCH_T_PATH": "/opt/x/bin:$PATH", "MLAUNCH_T_DOLLAR": "a$$b"},
                            setup=["export MLAUNCH_T_SETUP=from-setup"])
    r = submit(slurm2, tmp_path, spec)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    lines = [json.loads(x) for x in re.findall(r"env (\{.*\})$", r.stdout, re.M)]
    assert sorted(x["rank"] for x in lines) == ["0", "1"]
    for x in lines:
        assert x["MLAUNCH_T_PATH"].startswith("/opt/x/bin:/") and "$" not in x["MLAUNCH_T_PATH"]
        assert x["MLAUNCH_T_DOLLAR"] == "a$b" and x["MLAUNCH_T_SETUP"] == "from-setup"


def test_slurm_failing_setup_line_fails_the_node(slurm2, tmp_path):
    spec = slurm_script_job(tmp_path, "env_job.py", [], nproc=1, setup=["sh -c 'exit 3'"])
    r = submit(slurm2, tmp_path, spec)
    assert r.returncode != 0, r.stdout[-3000:]
    assert "mlaunch: cluster.setup[0] failed on this node (exit 3): sh -c 'exit 3'" in r.stdout
    assert not re.search(r"env \{", r.stdout)

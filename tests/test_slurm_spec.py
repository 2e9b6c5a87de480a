"""cluster.scheduler: slurm: each bad combination of fields is one line naming the field."""
from __future__ import annotations

import copy
import os

import pytest

from launcher.errors import SpecError
from launcher.spec import load_spec, node_procs, parse_spec, validate

from .helpers import CONFIGS, DELETE, load_yaml, set_path, write_spec

LORA = os.path.join(CONFIGS, "slurm", "qwen2-7b-lora.yaml")


def lora() -> dict:
    return copy.deepcopy(load_yaml(LORA))


def problems(data: dict) -> list[str]:
    with pytest.raises(SpecError) as err:
        validate(data)
    return [str(p) for p in err.value.problems]


def test_examples_validate_with_the_allocation_as_world():
    job = load_spec(LORA)
    assert job.cluster.scheduler == "slurm" and node_procs(job.cluster) == [4, 4, 4, 4]
    assert job.cluster.hosts is None


def with_(path: str, value, base=None) -> dict:
    return set_path(base or lora(), path, value)

CASES = [
    ("cluster.hosts", ["a", "b"], "cluster.hosts: with scheduler slurm the nodes come from the allocation; remove hosts"),
    ("cluster.master_addr", "10.0.0.1", "cluster.master_addr: with scheduler slurm the nodes come from the allocation: the master is its first node"),
    ("cluster.cuda_visible_devices", [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]],
     "cluster.cuda_visible_devices: per-node lists need known nodes"),
    ("cluster.ssh", {"user": "train"}, "cluster.ssh: mlaunch does not SSH to Slurm nodes"),
    ("cluster.slurm.nodes", DELETE, "cluster.slurm.nodes: required with scheduler slurm"),
    ("cluster.slurm", DELETE, "cluster.slurm.nodes: required with scheduler slurm"),
    ("cluster.shared_dir", DELETE, "cluster.shared_dir: required with scheduler slurm"),
    ("cluster.gpus_per_node", DELETE, "cluster.gpus_per_node: required"),
    ("cluster.gpus_per_node", [4, 4, 4, 4], "cluster.gpus_per_node: one count per host needs known hosts"),
    ("cluster.include", "a:0", "cluster.include: with scheduler slurm the nodes come from the allocation"),
    ("cluster.first_nodes", 2, "cluster.first_nodes: with scheduler slurm the nodes come from the allocation"),
    ("cluster.slurm.time", "2 days", "cluster.slurm.time: '2 days' is not a Slurm time; use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"),
    ("cluster.slurm.time", "1:2:3:4", "cluster.slurm.time: '1:2:3:4' is not a Slurm time"),
    ("cluster.slurm.partition", "gpu a100", "cluster.slurm.partition: 'gpu a100': one word"),
    ("cluster.slurm.nodes", 0, "cluster.slurm.nodes: 0 is too small: write an integer from 1 to 100000"),
    ("cluster.slurm.nodez", 2, "cluster.slurm.nodez: unknown key; did you mean 'nodes'?"),
    ("cluster.scheduler", "pbs", "cluster.scheduler: 'pbs' is not one of ssh, slurm"),
    ("batch.global", 64, "batch.global: 64 ≠ 4 nodes × 4 GPUs × 2 per device × 8 accumulation = 256"),
    ("cluster.slurm.extra_sbatch", {"gres": "gpu:4", "cpus-per-task": 8, "N": 3},
     "cluster.slurm.extra_sbatch.N: not a long sbatch option name"),
    ("cluster.slurm.extra_sbatch", {"mem": False}, "cluster.slurm.extra_sbatch.mem: false: give true for a flag"),
]
OWNED = ["nodes", "ntasks", "ntasks-per-node", "output", "error", "job-name", "open-mode",
         "parsable", "requeue", "no-requeue", "array", "wrap", "chdir", "partition", "account",
         "qos", "time", "constraint", "exclusive", "reservation", "dependency"]


@pytest.mark.parametrize("path,value,expected", CASES, ids=[f"{c[0]}={c[1]!r}"[:50] for c in CASES])
def test_bad_combination_is_one_line(path, value, expected):
    got = problems(with_(path, value))
    assert len(got) == 1 and got[0].startswith(expected), got


@pytest.mark.parametrize("option", OWNED)
def test_owned_sbatch_option_refused_with_its_reason(option):
    got = problems(with_("cluster.slurm.extra_sbatch", {option: "x"}))
    assert len(got) == 1 and got[0].startswith(
        f"cluster.slurm.extra_sbatch.{option}: mlaunch owns --{option}: "), got
    assert len(got[0].split(": ", 2)[2]) > 10   # a reason, not just "owned"


@pytest.mark.parametrize("value", ["30", "30:00", "12:00:00", "2-00", "2-12:30", "2-12:30:00", "UNLIMITED"])
def test_slurm_time_forms_accepted(value):
    assert validate(with_("cluster.slurm.time", value)).cluster.slurm.time == value


def test_slurm_block_needs_scheduler_even_with_hosts():
    data = load_yaml(os.path.join(CONFIGS, "seed000-qwen2-7b-lora.yaml"))
    data["cluster"]["slurm"] = {"nodes": 4}
    assert problems(data) == ["cluster.slurm: given but cluster.scheduler is ssh; set "
                              "`scheduler: slurm`, or remove the slurm block"]


def test_hostfile_with_slurm_is_refused(tmp_path):
    (tmp_path / "hosts.txt").write_text("a slots=4\nb slots=4\n")
    data = with_("cluster.hostfile", "hosts.txt")
    with pytest.raises(SpecError) as err:
        parse_spec(open(write_spec(tmp_path, data)).read(), source=str(tmp_path / "job.yaml"))
    assert [str(p) for p in err.value.problems] == [
        "cluster.hostfile: with scheduler slurm the nodes come from the allocation; remove "
        "hostfile and set cluster.slurm.nodes"]


def test_cli_prints_one_line_per_problem_exit_2(tmp_path):
    from .helpers import mlaunch
    data = with_("cluster.hosts", ["a"], with_("cluster.slurm.time", "soon"))
    r = mlaunch("validate", write_spec(tmp_path, data))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert lines[1:] == [
        "mlaunch: cluster.hosts: with scheduler slurm the nodes come from the allocation; remove "
        "hosts and set cluster.slurm.nodes",
        "mlaunch: cluster.slurm.time: 'soon' is not a Slurm time; use MM, MM:SS, HH:MM:SS, D-HH, "
        "D-HH:MM or D-HH:MM:SS, e.g. 2-00:00:00"], r.stderr

"""Issue 27's spec half: every shipped spec validates (or is refused as documented), values
that cannot run are refused, and each message says field, value and fix in mlaunch's voice."""
from __future__ import annotations

import copy
import glob
import os

import pytest
import yaml

from launcher.errors import SpecError
from launcher.runs.outputdir import Master
from launcher.preflight.probe import Ctx
from launcher.preflight.software import _torchrun_problem
from launcher.spec import load_spec, validate

from .helpers import plan_of, CONFIGS, seed000
from .lf_examples import REFUSED

SPECS = sorted(p for p in glob.glob(f"{CONFIGS}/**/*.yaml", recursive=True))
# Specs meant to be refused, with the first line of their refusal (documented in DIFFERENCES.md).
DOCUMENTED_REFUSALS = {os.path.join(CONFIGS, "lf-examples", f"{k}.yaml"): v for k, v in REFUSED.items()}


def lines(data: dict) -> list[str]:
    with pytest.raises(SpecError) as err:
        validate(data)
    return [str(p) for p in err.value.problems]


def test_the_walk_finds_every_directory_of_specs():
    assert {os.path.dirname(p) for p in SPECS} == {CONFIGS, *(os.path.join(CONFIGS, d) for d in
                                                   ("lf-examples", "swift-examples", "slurm", "ray"))}
    assert len(SPECS) >= 45


@pytest.mark.parametrize("path", SPECS, ids=[os.path.relpath(p, CONFIGS) for p in SPECS])
def test_every_shipped_spec_validates_or_is_refused_as_documented(path):
    if path in DOCUMENTED_REFUSALS:
        with pytest.raises(SpecError) as err:
            load_spec(path)
        assert [str(p) for p in err.value.problems][0].startswith(DOCUMENTED_REFUSALS[path])
    else:
        load_spec(path)


def test_empty_dataset_list_is_refused():
    assert lines({**seed000(), "dataset": []}) == [
        "dataset: [] names no dataset; give one, e.g. `dataset: alpaca_en_demo`, or a list of them"]
    assert lines({**seed000(), "dataset": ["alpaca_en_demo", ""]}) == [
        "dataset[1]: '' is an empty name; remove it from the list or write the dataset's name"]


def slurm_with(extra: dict) -> dict:
    data = yaml.safe_load(open(os.path.join(CONFIGS, "slurm", "qwen2-7b-lora.yaml")))
    data["cluster"]["slurm"]["extra_sbatch"] = extra
    return data


@pytest.mark.parametrize("extra,expected", [
    ({"gres": "gpu:8"}, "cluster.slurm.extra_sbatch.gres: 'gpu:8' asks for 8 GPUs per node but "
     "cluster.gpus_per_node is 4 (the processes torchrun starts per node); make them agree, e.g. "
     "`gres: gpu:4` or `gpus_per_node: 8`"),
    ({"gres": "gpu:a100:8,shard:2"}, "e.g. `gres: gpu:a100:4,shard:2`"),
    ({"gpus-per-node": 8}, "cluster.slurm.extra_sbatch.gpus-per-node: 8 asks for 8 GPUs per node"),
    ({"gpus-per-node": "h100:2"}, "'h100:2' asks for 2 GPUs per node"),
    ({"gpus": 32}, "cluster.slurm.extra_sbatch.gpus: 32 asks for 8 GPUs per node (32 over 4 nodes)"
     " but cluster.gpus_per_node is 4 (the processes torchrun starts per node); make them agree, "
     "e.g. `gpus: 16` or `gpus_per_node: 8`"),
])
def test_slurm_gpu_requests_must_match_gpus_per_node(extra, expected):
    got = lines(slurm_with(extra))
    assert len(got) == 1 and expected in got[0], got


def test_slurm_gpu_requests_that_match_pass():
    for extra in ({"gres": "gpu:4"}, {"gpus": 16}, {"gpus-per-node": "a100:4"}, {"mem": 0}):
        job = validate(slurm_with(extra))
        assert {k: str(v) for k, v in job.cluster.slurm.extra_sbatch.items()} == {k: str(v) for k, v in extra.items()}


def test_uneven_world_arithmetic_reads_as_one_product():
    data = seed000()
    data["cluster"]["hosts"] = ["a", "b", "c"]
    data["cluster"]["gpus_per_node"] = [4, 1, 2]
    data["cluster"].pop("master_addr", None)
    data["batch"] = {"per_device": 2, "grad_accum": 4, "global": 64}
    assert lines(data) == ["batch.global: 64 ≠ 7 GPUs (4+1+2 on 3 nodes) × 2 per device × 4 accumulation = 56; "
                           "set global to 56, change per_device/grad_accum, or omit global"]


def test_missing_trainer_beside_training_suggests_no_misspelling():
    data = seed000()
    data.pop("trainer")
    assert lines(data) == ["trainer: required: one of llamafactory, swift, script; add e.g. "
                           "`trainer: llamafactory`"]


def test_trainer_specific_renames_and_top_level_env():
    data = seed000()
    data["max_length"] = data.pop("cutoff_len")
    data["env"] = {"NCCL_DEBUG": "INFO"}
    assert lines(data) == [
        "max_length: unknown key: LLaMA-Factory's name for it is cutoff_len; write `cutoff_len: N` "
        "(max_length is ms-swift's)",
        "env: unknown key: the environment of every rank is cluster.env; move the block under cluster:"]
    swift = yaml.safe_load(open(os.path.join(CONFIGS, "seed003-qwen2.5-14b-swift-lora.yaml")))
    swift.pop("max_length", None)
    swift["cutoff_len"] = 2048
    assert lines(swift) == ["cutoff_len: unknown key: ms-swift's name for it is max_length; write "
                            "`max_length: N` (cutoff_len is LLaMA-Factory's)"]


def mutated(path: str, value) -> dict:
    data = copy.deepcopy(seed000())
    *head, leaf = path.split(".")
    node = data
    for k in head:
        node = node[k]
    if value is KeyError:
        node.pop(leaf)
    else:
        node[leaf] = value
    return data


@pytest.mark.parametrize("path,value,expected", [
    ("cluster.master_port", 70000, "cluster.master_port: 70000 is too large: write an integer from 1024 to 65535"),
    ("cluster.master_port", 80, "cluster.master_port: 80 is too small: write an integer from 1024 to 65535"),
    ("cluster.hosts", "192.168.1.10", "cluster.hosts: '192.168.1.10' is one value, not a list: write "
     "`hosts: [192.168.1.10]`; node 0 first"),
    ("batch", KeyError, "batch: required field missing; add `batch: {per_device: 1, grad_accum: 8}`, "
     "or `batch: {global: 64}` to let mlaunch choose the rest"),
    ("cluster.ssh.strict_host_keys", "maybe", "cluster.ssh.strict_host_keys: 'maybe' is not true or "
     "false: write true or false"),
    ("training.learning_rate", "fast", "training.learning_rate: 'fast' is not a number: write a number > 0"),
    ("training.epochs", -1, "training.epochs: -1 is too small: write a number > 0"),
    ("model", None, "model: empty; write `model: /path/to/model`, or a hub id"),
    ("cluster.env.NCCL_DEBUG", [1], "cluster.env.NCCL_DEBUG: [1] is not text: write text"),
    ("precision", "bf32", "precision: 'bf32' is not one of bf16, fp16, fp32; did you mean 'fp32'?"),
    ("cluster.gpus_per_node", [4, 4, "x", 4], "cluster.gpus_per_node[2]: 'x' is not an integer: "
     "write an integer from 1 to 1024"),
])
def test_pydantic_errors_in_mlaunchs_voice(path, value, expected):
    got = lines(mutated(path, value))
    assert len(got) == 1 and got[0].startswith(expected), got
    assert "Input should" not in got[0] and "(got " not in got[0]


def test_relative_paths_are_named_with_where_they_resolve():
    job = load_spec(os.path.join(CONFIGS, "quickstart.yaml"))
    assert ("cluster.python '.venvs/quickstart/bin/python' is relative: the nodes resolve it in the "
            "directory each node starts in: the one you run mlaunch from for local nodes, the SSH "
            "user's home on other machines (cluster.workdir chooses one)") in job._notes
    mixed = load_spec(os.path.join(CONFIGS, "hostfile-mixed-lora.yaml"))
    assert "cluster.hostfile 'hosts-mixed.txt' is relative: mlaunch reads it from the spec's directory" \
        in mixed._notes


def test_a_system_python3_is_used_itself():
    data = yaml.safe_load(open(os.path.join(CONFIGS, "allreduce-2x2.yaml")))
    assert data["cluster"]["python"] == "/usr/bin/python3"
    plan = plan_of(validate(data), run_id="py3")
    assert plan.nodes[0].argv[:3] == ("/usr/bin/python3", "-m", "torch.distributed.run")
    assert Master(plan, executor=None).python == "/usr/bin/python3"
    ctx = type("Ctx", (), {"job": plan.job})()
    assert Ctx.python.fget(ctx) == "/usr/bin/python3"   # preflight runs the named interpreter
    assert _torchrun_problem(ctx, {"wanted": None, "ok": True, "module": True}, "2.13.0") is None


def test_an_environments_python_keeps_torchrun_beside_it():
    plan = plan_of(load_spec(os.path.join(CONFIGS, "seed000-qwen2-7b-lora.yaml")), run_id="conda")
    assert plan.nodes[0].argv[0] == "/opt/conda/bin/torchrun"

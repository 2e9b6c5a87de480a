"""Golden files: every template output of every example in configs/ is pinned byte for byte.

Regenerate after a deliberate template change with MLAUNCH_UPDATE_GOLDEN=1 and review the diff.
"""
from __future__ import annotations

import glob
import json
import os
import posixpath

import pytest
import yaml

from launcher.plan.launch_plan import build_plan
from launcher.spec import LLAMAFACTORY_OWNED, load_spec, node_procs

from .helpers import CONFIGS, ROOT, check_golden

GOLDEN = os.path.join(ROOT, "tests", "golden")
EXAMPLES = sorted(glob.glob(f"{CONFIGS}/*.yaml"))


@pytest.fixture(autouse=True)
def _one_user(monkeypatch):
    """The default run dir is named for the user (/tmp/mlaunch-<user>): the same on every machine."""
    monkeypatch.setenv("LOGNAME", "user")


def outputs(path: str) -> dict[str, str]:
    """Every rendered text of one example: node scripts (masked and real) and files."""
    plan = build_plan(load_spec(path), run_id="GOLDEN")
    out = {f"node{n.rank}.sh": n.script for n in plan.nodes}
    out.update({f"node{n.rank}.display.sh": n.display for n in plan.nodes})
    out.update({posixpath.basename(f.path): f.content for f in plan.files})
    return out


@pytest.mark.parametrize("path", EXAMPLES, ids=[os.path.basename(p) for p in EXAMPLES])
def test_golden(path):
    check_golden(os.path.join(GOLDEN, os.path.splitext(os.path.basename(path))[0]), outputs(path))


@pytest.mark.parametrize("path", EXAMPLES, ids=[os.path.basename(p) for p in EXAMPLES])
def test_rendered_files_parse_and_agree(path):
    job = load_spec(path)
    plan = build_plan(job, run_id="GOLDEN")
    files = {posixpath.basename(f.path): f.content for f in plan.files}
    deepspeed = getattr(job, "deepspeed", None)
    lf = job.trainer == "llamafactory"
    expected = ({"llamafactory.yaml"} if lf else set()) | ({"ds_config.json"} if deepspeed else set()) | (
        {"llamafactory_entry.py"} if deepspeed and lf else set())
    assert set(files) == expected
    if deepspeed:
        check_ds_config(job, json.loads(files["ds_config.json"]), files["ds_config.json"])
        assert any(posixpath.join(plan.run_dir, "ds_config.json") in n.script for n in plan.nodes) or \
            job.trainer == "llamafactory"
    if job.trainer == "llamafactory":
        check_llamafactory_yaml(job, plan, yaml.safe_load(files["llamafactory.yaml"]))
    for node in plan.nodes:
        assert f"--node-rank {node.rank} " in node.script
        assert "--nnodes %d " % len(job.cluster.hosts) in node.script


def check_ds_config(job, ds: dict, text: str) -> None:
    processes = sum(node_procs(job.cluster))
    # "auto" only where transformers sizes buckets from the loaded model (config.json not here).
    autos = {k for k, v in ds["zero_optimization"].items() if v == "auto"}
    assert autos <= {"reduce_bucket_size", "stage3_prefetch_bucket_size",
                     "stage3_param_persistence_threshold"} and text.count('"auto"') == len(autos)
    assert ds["train_batch_size"] == processes * job.batch.per_device * job.batch.grad_accum
    assert ds["train_micro_batch_size_per_gpu"] == job.batch.per_device
    assert ds["gradient_accumulation_steps"] == job.batch.grad_accum
    assert ds["zero_optimization"]["stage"] == job.deepspeed.stage
    assert ds["gradient_clipping"] == job.training.max_grad_norm
    assert "optimizer" not in ds  # the Trainer builds its own (launcher/spec/deepspeed.py)
    assert ds["bf16"]["enabled"] == (job.precision == "bf16")
    assert ds["fp16"]["enabled"] == (job.precision == "fp16")


def check_llamafactory_yaml(job, plan, lf: dict) -> None:
    # Every key mlaunch renders is one it owns: passthrough can never collide silently.
    assert set(lf) - set(job.passthrough) <= set(LLAMAFACTORY_OWNED)
    assert lf["per_device_train_batch_size"] == job.batch.per_device
    assert lf["gradient_accumulation_steps"] == job.batch.grad_accum
    assert isinstance(lf["learning_rate"], float)
    assert lf["overwrite_output_dir"] is False
    assert lf["bf16"] == (job.precision == "bf16") and lf["fp16"] == (job.precision == "fp16")
    if job.deepspeed:
        assert lf["deepspeed"] == posixpath.join(plan.run_dir, "ds_config.json")


def test_torchrun_is_rendered_one_element_per_line_and_a_shell_var_stays_one():
    """torchrun's command line comes from templates/torchrun.j2 (render is its only producer):
    the job's torchrun, or the system interpreter's module; a scheduler's node rank stays a
    value the node's shell expands, quoted as such in the node script."""
    from launcher import render
    rank = render.ShellVar("SLURM_NODEID")
    argv = render.torchrun_argv(torchrun=None, python="/usr/bin/python3", nnodes=2, nproc=4,
                                node_rank=rank, master_addr="n0", master_port=29500,
                                log_dir="/r/torchrun/node1")
    assert argv[:3] == ["/usr/bin/python3", "-m", "torch.distributed.run"]
    assert argv[argv.index("--node-rank") + 1] is rank
    assert render.quote(argv[argv.index("--node-rank") + 1]) == '"${SLURM_NODEID}"'
    assert argv[argv.index("--max-restarts") + 1] == "0" and argv[-2:] == ["--log-dir", "/r/torchrun/node1"]
    argv = render.torchrun_argv(torchrun="/v/bin/torchrun", python=None, nnodes=1, nproc=1,
                                node_rank="0", master_addr="n0", master_port=1, log_dir="/l")
    assert argv[0] == "/v/bin/torchrun" and argv.count("--nnodes") == 1
    with pytest.raises(ValueError):
        render.torchrun_argv(torchrun="t", python=None, nnodes=1, nproc=1, node_rank="0",
                             master_addr="n0\n--x", master_port=1, log_dir="/l")

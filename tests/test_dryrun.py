"""The readable dry-run and `--dry-run --full`: both forms pinned byte for byte for every
example in configs/ (tests/golden/dryrun/; regenerate with MLAUNCH_UPDATE_GOLDEN=1 and review),
and the folding rule: nodes fold only when they differ in nothing but their rank."""
from __future__ import annotations

import dataclasses
import glob
import os

import pytest

from launcher.view import dryrun
from launcher.plan.launch_plan import build_plan
from launcher.view.present import describe_plan
from launcher.spec import load_spec, validate

from .helpers import CONFIGS, ROOT, SEED000, seed000

GOLDEN = os.path.join(ROOT, "tests", "golden", "dryrun")
EXAMPLES = sorted(glob.glob(f"{CONFIGS}/*.yaml"))
SECRET = "hf_secret_value_123"


@pytest.fixture(autouse=True)
def _one_user(monkeypatch):
    """The default run dir is named for the user (/tmp/mlaunch-<user>): the same on every machine."""
    monkeypatch.setenv("LOGNAME", "user")


def nodes_part(text: str) -> list[str]:
    """The header and the node blocks: everything before the first rendered file."""
    return text.split("\n=== file ")[0].rstrip("\n").split("\n")


@pytest.mark.parametrize("full", [False, True], ids=["summary", "full"])
@pytest.mark.parametrize("path", EXAMPLES, ids=[os.path.basename(p) for p in EXAMPLES])
def test_dry_run_golden(path, full):
    name = os.path.splitext(os.path.basename(path))[0] + (".full" if full else "") + ".txt"
    got = describe_plan(build_plan(load_spec(path), run_id="GOLDEN"), full=full)
    golden = os.path.join(GOLDEN, name)
    if os.environ.get("MLAUNCH_UPDATE_GOLDEN"):
        os.makedirs(GOLDEN, exist_ok=True)
        with open(golden, "w", encoding="utf-8") as fh:
            fh.write(got)
    with open(golden, encoding="utf-8") as fh:
        assert got == fh.read(), f"dry-run of {path} differs from {golden}"


def test_seed000_summary_is_short_and_complete():
    plan = build_plan(load_spec(SEED000), run_id="R")
    text = describe_plan(plan)
    head = nodes_part(text)
    assert len(head) <= 30, "\n".join(head)
    assert SECRET not in text
    full = describe_plan(plan, full=True)
    assert len(nodes_part(full)) > 150 and SECRET not in full
    node0 = plan.nodes[0]
    # Everything a user checks: every host, the user's env, node 0's exact command, the files.
    for n in plan.nodes:
        assert n.host in text
    for k, v in dryrun.user_env(node0):
        assert f"{k}=" in text
    assert "NCCL_SOCKET_IFNAME=eth0 NCCL_DEBUG=WARN HF_TOKEN='***'" in text
    assert " ".join(node0.argv) in text
    for f in plan.files:
        assert f.content.rstrip("\n") in text


def two_on_one_host() -> dict:
    data = seed000()
    data["cluster"]["hosts"] = ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"]
    data["cluster"]["gpus_per_node"] = 2
    data["cluster"]["cuda_visible_devices"] = [[0, 1], [2, 3], [0, 1], [2, 3]]
    data["batch"].pop("global")
    return data


def test_nodes_with_other_gpus_fold_only_with_their_equals():
    plan = build_plan(validate(two_on_one_host()), run_id="R")
    assert [[n.rank for n in g] for g in dryrun.groups(plan.nodes)] == [[0, 2], [1, 3]]
    head = nodes_part(describe_plan(plan))
    assert "  processes: 2, GPUs 0,1 (CUDA_VISIBLE_DEVICES)" in head
    assert "  processes: 2, GPUs 2,3 (CUDA_VISIBLE_DEVICES)" in head
    assert "node 2: as node 0, with --node-rank 2" in head
    assert "node 3: as node 1, with --node-rank 3" in head


def test_nodes_with_other_process_counts_do_not_fold():
    plan = build_plan(validate(seed000()), run_id="R")
    n1 = plan.nodes[1]
    argv = list(n1.argv)
    argv[argv.index("--nproc-per-node") + 1] = "2"
    nodes = (plan.nodes[0], dataclasses.replace(n1, argv=tuple(argv)), *plan.nodes[2:])
    assert [[n.rank for n in g] for g in dryrun.groups(nodes)] == [[0, 2, 3], [1]]
    text = describe_plan(dataclasses.replace(plan, nodes=nodes))
    assert "nodes 2, 3: as node 0, with --node-rank 2, 3" in text
    assert "node 1: 192.168.1.11 (ssh train@192.168.1.11:22)\n  processes: 2, on cuda:0–1 by LOCAL_RANK (CUDA_VISIBLE_DEVICES not set; CPU on a host without GPUs)" in text


def test_nodes_with_other_env_do_not_fold():
    plan = build_plan(validate(seed000()), run_id="R")
    n2 = plan.nodes[2]
    nodes = (*plan.nodes[:2], dataclasses.replace(n2, env=n2.env + (("NCCL_IB_HCA", "mlx5_1"),)), plan.nodes[3])
    assert [[n.rank for n in g] for g in dryrun.groups(nodes)] == [[0, 1, 3], [2]]

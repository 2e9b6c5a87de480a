"""cluster.scheduler: ray without a Ray cluster: its rules (one line each), the trainers' own
Ray modes refused with what to write instead, the placement and the dry-run (golden, byte for
byte; MLAUNCH_UPDATE_GOLDEN=1 regenerates), which imports no ray, paramiko or torch."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from launcher.backends import backend_of
from launcher.backends.ray.show import describe_ray
from launcher.spec import load_spec

from .helpers import CONFIGS, ROOT, check_golden, mlaunch, plan_of, seed000, write_spec

GOLDEN = os.path.join(ROOT, "tests", "golden")
EXAMPLE = os.path.join(CONFIGS, "ray", "qwen2-7b-lora.yaml")


@pytest.fixture(autouse=True)
def _one_user(monkeypatch):
    monkeypatch.setenv("LOGNAME", "user")
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_123")


def ray_spec(**cluster) -> dict:
    data = seed000()
    c = data["cluster"]
    for k in ("hosts", "master_addr"):
        c.pop(k, None)
    data["batch"].pop("global", None)
    c.update({"scheduler": "ray", "ray": {"address": "ray://head:10001", "nodes": 4}}, **cluster)
    return data


def problems(tmp_path, data) -> list[str]:
    r = mlaunch("validate", write_spec(tmp_path, data))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    return [ln for ln in r.stderr.splitlines() if ln.startswith("mlaunch: ") and "invalid" not in ln]


def test_golden():
    job = load_spec(EXAMPLE)
    from launcher.plan.meminputs import inputs
    plan = plan_of(job, run_id="GOLDEN", memory=inputs(job))
    out = {"dry-run.txt": describe_ray(plan), "node0.sh": plan.nodes[0].display,
           "node1.sh": plan.nodes[1].display}
    out.update({os.path.basename(f.path): f.content for f in plan.files})
    check_golden(os.path.join(GOLDEN, "ray-qwen2-7b-lora"), out)


def test_the_cli_dry_run_is_the_golden_one_and_imports_no_ray_ssh_or_torch():
    code = ("import sys\nfrom launcher.cli.main import main\n"
            "try:\n"
            f"    main(['submit', {EXAMPLE!r}, '--dry-run', '--run-id', 'GOLDEN'])\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "bad = [m for m in ('ray', 'fabric', 'paramiko', 'torch') if m in sys.modules]\n"
            "print('IMPORTED', bad)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "LOGNAME": "user", "HF_TOKEN": "hf_secret_value_123"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().endswith("IMPORTED []")
    with open(os.path.join(GOLDEN, "ray-qwen2-7b-lora", "dry-run.txt"), encoding="utf-8") as fh:
        assert r.stdout.replace("IMPORTED []\n", "") == fh.read()
    assert "hf_secret_value_123" not in r.stdout


def test_placement_one_bundle_per_node_fixed_ranks_master_from_the_agent():
    plan = plan_of(load_spec(EXAMPLE), run_id="R")
    assert [n.host for n in plan.nodes] == ["bundle0", "bundle1"]
    for n in plan.nodes:
        argv = " ".join(n.argv)
        assert f"--node-rank {n.rank} " in argv and "--master-addr ${MLAUNCH_MASTER_ADDR}" in argv
        assert f"echo $$ > /tmp/mlaunch-user/.mlaunch/R/node{n.rank}.pid" in n.script   # guarded
    assert not plan.unheld   # the helpers run on node 0, through its agent


def test_rules_one_line_each(tmp_path):
    data = ray_spec(hosts=["a", "b"], master_addr="a", spare_hosts=["c"],
                    gpus_per_node=[2, 2], ssh={"user": "x"})
    data["cluster"]["ray"].pop("nodes")
    got = problems(tmp_path, data)
    for field in ("cluster.ray.nodes", "cluster.hosts", "cluster.master_addr", "cluster.ssh",
                  "cluster.spare_hosts", "cluster.gpus_per_node"):
        assert any(ln.startswith(f"mlaunch: {field}: ") for ln in got), (field, got)


def test_a_ray_block_without_scheduler_ray(tmp_path):
    data = seed000()
    data["cluster"]["ray"] = {"nodes": 2}
    got = problems(tmp_path, data)
    assert any("cluster.ray: given but cluster.scheduler is ssh; set `scheduler: ray`" in ln for ln in got)


def test_min_nodes_above_the_ray_nodes(tmp_path):
    got = problems(tmp_path, ray_spec(min_nodes=5))
    assert any("cluster.min_nodes: 5 is more than the 4 nodes of cluster.ray.nodes" in ln for ln in got)


def test_empty_bundle_refused(tmp_path):
    data = ray_spec()
    data["cluster"]["ray"]["resources"] = {"CPU": 0}
    got = problems(tmp_path, data)
    assert any(ln.startswith("mlaunch: cluster.ray.resources: every amount is 0") for ln in got)


@pytest.mark.parametrize("key,value,instead", [
    ("ray_num_workers", 8, "ray_num_workers -> cluster.ray.nodes × cluster.gpus_per_node"),
    ("use_ray", True, "use_ray -> cluster.scheduler: ray"),
    ("ray_storage_path", "/x", "ray_storage_path -> output_dir")])
def test_llamafactory_ray_mode_gets_one_line_saying_what_to_write(tmp_path, key, value, instead):
    data = seed000()
    data.setdefault("passthrough", {})[key] = value
    got = problems(tmp_path, data)
    mine = [ln for ln in got if ln.startswith(f"mlaunch: passthrough.{key}:")]
    assert len(mine) == 1 and "set cluster.scheduler: ray and cluster.ray:" in mine[0]
    assert instead in mine[0]


def test_use_ray_env_says_what_to_write(tmp_path):
    data = seed000()
    data["cluster"]["env"]["USE_RAY"] = "1"
    got = problems(tmp_path, data)
    assert any(ln.startswith("mlaunch: cluster.env.USE_RAY:") and "set cluster.scheduler: ray" in ln
               for ln in got)


def test_swift_use_ray_says_what_to_write(tmp_path):
    import glob
    import yaml
    path = sorted(glob.glob(os.path.join(CONFIGS, "seed003-*swift-lora.yaml")))[0]
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    data.setdefault("passthrough", {})["use_ray"] = True
    got = problems(tmp_path, data)
    assert any(ln.startswith("mlaunch: passthrough.use_ray: ms-swift's own Ray mode") and
               "set cluster.scheduler: ray" in ln for ln in got), got


def test_backend_is_ray_and_table_import_stays_light():
    assert backend_of(load_spec(EXAMPLE)).name == "ray"
    r = subprocess.run([sys.executable, "-c", "import launcher.backends as b, sys; "
                        "b.backend_for('ray'); print('ray' in sys.modules)"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.strip() == "False", r.stderr

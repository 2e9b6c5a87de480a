"""The CLI through a real subprocess: exit codes, one-line errors, masking, the dry-run plan."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from .helpers import ROOT, SEED000, mlaunch, seed000, write_spec

SECRET = "hf_secret_value_123"


def test_dry_run_prints_every_node_and_file(tmp_path):
    r = mlaunch("submit", SEED000, "--dry-run", "--run-id", "R1", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "node 0: 192.168.1.10 (ssh train@192.168.1.10:22)" in out
    assert ("/opt/conda/bin/torchrun --nnodes 4 --nproc-per-node 4 --node-rank 0 "
            "--master-addr 192.168.1.10 --master-port 29500") in out
    assert "nodes 1–3: as node 0, with --node-rank 1..3\n  hosts: 192.168.1.11, 192.168.1.12, 192.168.1.13" in out
    assert "=== file /mnt/shared/work/.mlaunch/train/R1/llamafactory.yaml ===" in out
    assert "=== file /mnt/shared/work/.mlaunch/train/R1/ds_config.json ===" in out
    assert "global batch: 256 = 4 nodes × 4 GPUs × 2 per device × 8 accumulation" in out
    assert "HF_TOKEN='***'" in out
    assert SECRET not in out + r.stderr
    assert os.listdir(tmp_path) == []  # wrote nothing


def test_dry_run_full_prints_every_node_script(tmp_path):
    r = mlaunch("submit", SEED000, "--dry-run", "--full", "--run-id", "R1", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for k, ip in enumerate(["192.168.1.10", "192.168.1.11", "192.168.1.12", "192.168.1.13"]):
        assert f"=== node {k}: {ip} (ssh train@{ip}:22) ===" in out
        assert (f"exec /opt/conda/bin/torchrun --nnodes 4 --nproc-per-node 4 --node-rank {k} "
                "--master-addr 192.168.1.10 --master-port 29500") in out
    assert "export HF_TOKEN='***'" in out
    assert SECRET not in out + r.stderr
    assert os.listdir(tmp_path) == []
    r = mlaunch("submit", SEED000, "--full", cwd=str(tmp_path))
    assert r.returncode == 2 and r.stderr == "mlaunch: --full only goes with --dry-run\n"


def test_dry_run_connects_nowhere_and_imports_no_ssh_or_torch():
    code = (
        "import sys\n"
        "from launcher.cli.main import main\n"
        "try:\n"
        f"    main(['submit', {SEED000!r}, '--dry-run'])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "bad = [m for m in ('fabric', 'paramiko', 'invoke', 'torch') if m in sys.modules]\n"
        "print('IMPORTED', bad)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "IMPORTED []" in r.stdout


def test_invalid_spec_exit_2_one_line_per_problem(tmp_path):
    data = seed000()
    data["batch"]["global"] = 64
    data["cluster"]["env"]["MASTER_PORT"] = "29501"
    r = mlaunch("submit", write_spec(tmp_path, data), "--dry-run")
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert lines[0].endswith("invalid job spec")
    assert "mlaunch: batch.global: 64 ≠ 4 nodes × 4 GPUs × 2 per device × 8 accumulation = 256" in r.stderr
    assert any(line.startswith("mlaunch: cluster.env.MASTER_PORT:") for line in lines)
    assert len(lines) == 3 and "Traceback" not in r.stderr and SECRET not in r.stderr


def test_debug_shows_traceback(tmp_path):
    data = seed000()
    data["batch"]["global"] = 64
    r = mlaunch("validate", write_spec(tmp_path, data), env={"MLAUNCH_DEBUG": "1"})
    assert r.returncode == 2 and "Traceback" in r.stderr


def test_missing_file_and_yaml_error(tmp_path):
    r = mlaunch("validate", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "cannot read" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n  cluster: 1\n")
    r = mlaunch("validate", str(bad))
    assert r.returncode == 2 and f"{bad}:2:10: YAML syntax" in r.stderr


def test_validate_ok():
    r = mlaunch("validate", SEED000)
    assert r.returncode == 0 and "ok (llamafactory, 4 nodes × 4 processes)" in r.stdout


def test_schema_is_json_schema():
    r = mlaunch("schema")
    schema = json.loads(r.stdout)
    names = json.dumps(schema)
    assert r.returncode == 0 and "LlamaFactoryJob" in names and "master_port" in names
    assert '"global"' in names  # the alias users write, not the Python name


def test_render_writes_files_and_scripts(tmp_path):
    r = mlaunch("render", SEED000, "--out", str(tmp_path / "out"), "--run-id", "R2")
    assert r.returncode == 0, r.stderr
    names = sorted(os.listdir(tmp_path / "out"))
    assert names == [".mlaunch-render", "ds_config.json", "ds_config.json.sources.txt", "llamafactory.yaml",
                     "llamafactory_entry.py", "node0.sh", "node1.sh", "node2.sh", "node3.sh"]
    for name in names:
        assert SECRET not in (tmp_path / "out" / name).read_text()
    assert "--node-rank 3" in (tmp_path / "out" / "node3.sh").read_text()


def test_help_and_unknown_command():
    assert mlaunch("--help").returncode == 0
    r = mlaunch("frobnicate")
    assert r.returncode == 2 and "No such command" in r.stderr

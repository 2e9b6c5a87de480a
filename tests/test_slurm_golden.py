"""Golden Slurm renderings: the batch script, the node script and the dry-run of each
configs/slurm/ example, byte for byte (MLAUNCH_UPDATE_GOLDEN=1 regenerates; review the diff)."""
from __future__ import annotations

import glob
import os
import posixpath

import pytest

from launcher.backends.slurm import sbatch
from launcher.backends.slurm.show import describe_sbatch
from launcher.spec import load_spec

from .helpers import plan_of, CONFIGS, ROOT, check_golden, mlaunch

GOLDEN = os.path.join(ROOT, "tests", "golden")
EXAMPLES = sorted(glob.glob(f"{CONFIGS}/slurm/*.yaml"))


@pytest.fixture(autouse=True)
def _one_user(monkeypatch):
    """The run dir is named for the user (<shared_dir>/.mlaunch/<user>): the same on every machine."""
    monkeypatch.setenv("LOGNAME", "user")


def outputs(path: str) -> dict[str, str]:
    from launcher.plan.meminputs import inputs
    job = load_spec(path)
    plan = plan_of(job, run_id="GOLDEN", memory=inputs(job))   # as the CLI's dry run
    req = sbatch.request(plan)
    out = {"job.sbatch": req.script, "node.sh": req.node_script.content,
           "dry-run.txt": describe_sbatch(plan)}
    out.update({posixpath.basename(f.path): f.content for f in plan.files})
    return out


@pytest.mark.parametrize("path", EXAMPLES, ids=[os.path.basename(p) for p in EXAMPLES])
def test_golden(path):
    check_golden(os.path.join(GOLDEN, "slurm-" + os.path.splitext(os.path.basename(path))[0]), outputs(path))


def test_the_cli_dry_run_is_the_golden_one():
    path = os.path.join(CONFIGS, "slurm", "qwen2-7b-lora.yaml")
    r = mlaunch("submit", path, "--dry-run", "--run-id", "GOLDEN")
    assert r.returncode == 0, r.stderr
    with open(os.path.join(GOLDEN, "slurm-qwen2-7b-lora", "dry-run.txt"), encoding="utf-8") as fh:
        assert r.stdout == fh.read()


def test_secrets_stay_out_of_what_slurm_stores():
    plan = plan_of(load_spec(os.path.join(CONFIGS, "slurm", "qwen2-7b-lora.yaml")), run_id="G")
    req = sbatch.request(plan)
    secret = "hf_secret_value_123"
    assert secret not in req.script and secret not in req.node_script.content
    assert "HF_TOKEN" not in req.node_script.content
    assert req.secrets.content == f"export HF_TOKEN={secret}\n"
    assert f". {req.secrets.path}" in req.node_script.content
    assert secret not in describe_sbatch(plan)


def test_render_writes_job_sbatch(tmp_path):
    path = os.path.join(CONFIGS, "slurm", "qwen2-7b-full-zero3.yaml")
    r = mlaunch("render", path, "--out", str(tmp_path), "--run-id", "GOLDEN")
    assert r.returncode == 0, r.stderr
    written = sorted(os.listdir(tmp_path))
    assert {"job.sbatch", "node.sh", "llamafactory.yaml", "ds_config.json"} <= set(written)
    assert not [w for w in written if w.startswith("node0")], written   # one node script
    with open(os.path.join(GOLDEN, "slurm-qwen2-7b-full-zero3", "job.sbatch")) as fh:
        assert (tmp_path / "job.sbatch").read_text() == fh.read()


def test_a_dollar_in_a_referenced_secret_reaches_the_ranks_as_written_and_is_masked(monkeypatch, tmp_path):
    """cluster.env MY_KEY: ${SRC} (a plain name: a secret because it is a reference), whose value
    holds a `$`: Slurm's secrets file exports the value itself (it exported it with the `$`
    doubled, so the ranks got another value), and the mask covers the value the ranks print."""
    import yaml
    from launcher.spec.load import load_spec as load
    with open(os.path.join(CONFIGS, "slurm", "qwen2-7b-lora.yaml")) as fh:
        raw = yaml.safe_load(fh)
    monkeypatch.setenv("SRC", "zz$qqRSTU")

    def secrets_of(env: dict):
        raw["cluster"]["env"] = {**raw["cluster"].get("env", {}), **env}
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(raw))
        plan = plan_of(load(str(path)), run_id="G")
        return plan, sbatch.request(plan).secrets.content

    plan, text = secrets_of({"MY_KEY": "${SRC}"})
    assert "export MY_KEY='zz$qqRSTU'\n" in text
    assert plan.mask("rank 0: MY_KEY=zz$qqRSTU") == "rank 0: MY_KEY=***"
    # a URL with a password that names the node's own $NODE_HOST: expanded there, as over ssh
    _, text = secrets_of({"DATA_URL": "https://u:pw@$NODE_HOST/x"})
    assert 'export DATA_URL=https://u:pw@"${NODE_HOST}"/x\n' in text

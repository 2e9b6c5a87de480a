"""A checkpoint that already holds the whole schedule is never trained past; the rendered
overwrite_output_dir comment says why the line is there."""
from __future__ import annotations

import json
import stat

import pytest
import yaml

from launcher.plan.launch_plan import build_plan
from launcher.spec import load_spec

from .helpers import mlaunch, write_spec
from .test_resume_guard import checkpoint, lf_job, tree

COMPLETE = "training already complete at checkpoint-10 (global_step 10 of max_steps 10): not training again"


def final_checkpoint(out, step: int = 10, **state) -> None:
    """checkpoint-<step> as HF Trainer leaves it after its last step, with no final export."""
    checkpoint(out, step)
    full = {"global_step": step, "max_steps": step, "epoch": 2.0, "num_train_epochs": 2,
            "log_history": [{"step": step, "loss": 1.0}], **state}
    (out / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps(full))


@pytest.mark.parametrize("flag", ["--resume", "--resume=auto"])
def test_resume_of_a_finished_checkpoint_trains_nothing(tmp_path, flag):
    out = tmp_path / "out"
    final_checkpoint(out)
    before = {p: (out / p).read_bytes() for p in tree(out)}
    r = mlaunch("submit", write_spec(tmp_path, lf_job(tmp_path, str(out))), flag, "--no-preflight")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{COMPLETE}; the final weights are in {out}/checkpoint-10" in r.stdout
    assert not (tmp_path / "seen.yaml").exists(), "training was launched"
    assert {p: (out / p).read_bytes() for p in tree(out)} == before, "output_dir changed"


def test_finished_by_epochs(tmp_path):
    out = tmp_path / "out"
    final_checkpoint(out)
    spec = lf_job(tmp_path, str(out))
    spec["training"] = {"learning_rate": 1e-4, "epochs": 2, "save_steps": 5}
    r = mlaunch("resume", write_spec(tmp_path, spec), "--no-preflight")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("training already complete at checkpoint-10 (global_step 10, epoch 2 of epochs 2): "
            "not training again") in r.stdout
    assert not (tmp_path / "seen.yaml").exists()


def test_raised_max_steps_still_resumes(tmp_path):
    """The spec decides: the checkpoint's own max_steps 10 does not stop a run asked for 20."""
    out = tmp_path / "out"
    final_checkpoint(out)
    spec = lf_job(tmp_path, str(out))
    spec["training"]["max_steps"] = 20
    r = mlaunch("resume", write_spec(tmp_path, spec), "--no-preflight")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "already complete" not in r.stdout
    seen = yaml.safe_load((tmp_path / "seen.yaml").read_text())
    assert seen["resume_from_checkpoint"] == f"{out}/checkpoint-10"


FINAL_THEN_DIE = """#!/bin/sh
# Attempt 0: leaves the final checkpoint-10 complete, then dies as a killed rank would.
for last; do :; done
cp "$last" {record}
out={out}
if [ ! -d "$out/checkpoint-10" ]; then
  mkdir -p "$out/checkpoint-10" && printf w > "$out/checkpoint-10/adapter_model.safetensors"
  printf '{{"global_step": 10, "max_steps": 10}}' > "$out/checkpoint-10/trainer_state.json"
  exit 9
fi
echo "trained again" > {record}.again
"""


def test_restart_after_the_final_checkpoint_exits_0(tmp_path):
    out = tmp_path / "out"
    spec = lf_job(tmp_path, str(out))
    torchrun = tmp_path / "bin" / "torchrun"
    torchrun.write_text(FINAL_THEN_DIE.format(record=tmp_path / "seen.yaml", out=out))
    torchrun.chmod(stat.S_IRWXU)
    spec.update(max_restarts=2, restart_backoff_s=0)
    r = mlaunch("submit", write_spec(tmp_path, spec), "--no-preflight", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"restart 1/2 not needed: {COMPLETE}" in r.stdout
    assert "node0 localhost: exit 9; tearing down" in r.stdout, r.stdout
    assert not (tmp_path / "seen.yaml.again").exists(), "training was launched again"


@pytest.mark.parametrize("why, comment", [
    ("flag", "# mlaunch submit --overwrite: start fresh although output_dir holds checkpoints."),
    ("restart_fresh", "# An automatic restart with no complete checkpoint to resume: a fresh start"),
    ("fresh_over_left", "# --resume=auto found no complete checkpoint: a fresh start"),
    (None, "# Deliberately false: a re-launch resumes from a complete checkpoint"),
])
def test_overwrite_comment_says_why(tmp_path, why, comment):
    job = load_spec(write_spec(tmp_path, lf_job(tmp_path, str(tmp_path / "out"))))
    text = next(f.content for f in build_plan(job, overwrite=why, attempt=1 if why and "restart" in why else 0).files)
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("overwrite_output_dir:"))
    block = "\n".join(lines[max(0, at - 2):at])
    assert comment in block, block
    assert lines[at] == f"overwrite_output_dir: {'true' if why else 'false'}"
    if why != "flag":
        assert "--overwrite" not in block
    assert yaml.safe_load(text)["overwrite_output_dir"] is bool(why)

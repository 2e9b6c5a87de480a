"""output_dir guards: no clobbering, resume from the latest complete checkpoint, one run at a time."""
from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest
import yaml

from .loadfactor import limit
from .helpers import ROOT, mlaunch, script_job, write_spec

FAKE_TORCHRUN = """#!/bin/sh
# Records the LLaMA-Factory YAML it was given (last argument), then exits 0.
for last; do :; done
cp "$last" {record}
"""


def lf_job(tmp_path, out_dir: str) -> dict:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "torchrun").write_text(FAKE_TORCHRUN.format(record=tmp_path / "seen.yaml"))
    (bindir / "torchrun").chmod(stat.S_IRWXU)
    # The job's python is this interpreter (for mlaunch's own helpers); torchrun is the fake.
    (bindir / "python").symlink_to(sys.executable)
    return {"name": "lf", "trainer": "llamafactory",
            # torchrun always: the fake torchrun must run although the job is one process.
            "cluster": {"hosts": ["localhost"], "gpus_per_node": 1, "python": str(bindir / "python"),
                        "torchrun": "always"},
            "model": "/models/tiny", "template": "qwen", "dataset": "tiny", "cutoff_len": 64,
            "finetuning": {"type": "lora"}, "batch": {"per_device": 1},
            "training": {"learning_rate": 1e-4, "max_steps": 10, "save_steps": 5},
            "output_dir": out_dir}


def checkpoint(out, step: int, complete: bool = True) -> None:
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "adapter_model.safetensors").write_bytes(b"weights")
    if complete:
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))


def tree(path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)


def test_fresh_submit_refuses_existing_checkpoints(tmp_path):
    out = tmp_path / "out"
    checkpoint(out, 5)
    before = tree(out)
    r = mlaunch("submit", write_spec(tmp_path, lf_job(tmp_path, str(out))), "--no-preflight")
    assert r.returncode == 2
    assert f"{out} already holds checkpoints (latest complete: {out}/checkpoint-5); continue with --resume, or start over with --overwrite" in r.stderr
    assert not (tmp_path / "seen.yaml").exists(), "something started"
    assert tree(out) == before


def test_resume_skips_half_written_checkpoint(tmp_path):
    out = tmp_path / "out"
    checkpoint(out, 5)
    checkpoint(out, 10, complete=False)
    before = tree(out)
    r = mlaunch("submit", write_spec(tmp_path, lf_job(tmp_path, str(out))), "--resume", "--no-preflight")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "checkpoint-10: no trainer_state.json (interrupted save?) — using checkpoint-5" in r.stdout
    assert f"resuming from {out}/checkpoint-5" in r.stdout
    seen = yaml.safe_load((tmp_path / "seen.yaml").read_text())
    assert seen["resume_from_checkpoint"] == f"{out}/checkpoint-5"
    assert seen["overwrite_output_dir"] is False
    assert set(before) <= set(tree(out)), "a checkpoint file was deleted"


def test_resume_without_checkpoint(tmp_path):
    out = tmp_path / "out"
    spec = write_spec(tmp_path, lf_job(tmp_path, str(out)))
    r = mlaunch("resume", spec, "--no-preflight")
    assert r.returncode == 2 and "no complete checkpoint in" in r.stderr
    assert not (tmp_path / "seen.yaml").exists()
    r = mlaunch("submit", spec, "--resume=auto", "--no-preflight")
    assert r.returncode == 0 and "starting fresh (--resume=auto)" in r.stdout
    assert "resume_from_checkpoint" not in yaml.safe_load((tmp_path / "seen.yaml").read_text())


def test_resume_auto_over_half_checkpoint_starts_really_fresh(tmp_path):
    """Left alone, LLaMA-Factory would resume from the half-written checkpoint-10 itself."""
    out = tmp_path / "out"
    checkpoint(out, 10, complete=False)
    r = mlaunch("submit", write_spec(tmp_path, lf_job(tmp_path, str(out))), "--resume=auto", "--no-preflight")
    assert r.returncode == 0 and "starting fresh (--resume=auto)" in r.stdout, r.stdout + r.stderr
    seen = yaml.safe_load((tmp_path / "seen.yaml").read_text())
    assert "resume_from_checkpoint" not in seen and seen["overwrite_output_dir"] is True
    assert (out / "checkpoint-10").exists()


def test_overwrite_renders_overwrite(tmp_path):
    out = tmp_path / "out"
    checkpoint(out, 5)
    r = mlaunch("submit", write_spec(tmp_path, lf_job(tmp_path, str(out))), "--overwrite", "--no-preflight")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load((tmp_path / "seen.yaml").read_text())["overwrite_output_dir"] is True
    assert (out / "checkpoint-5" / "trainer_state.json").exists()


@pytest.mark.launches
def test_concurrent_submit_refused_then_stale_lock_taken_over(tmp_path):
    out = str(tmp_path / "out")
    # The first run sleeps until it is interrupted: the second submit is refused however long
    # a loaded machine takes to start it (a first run of fixed length once ended before).
    spec = write_spec(tmp_path, script_job(["localhost"], 1, "fail_or_sleep.py", ["-1", "0", "0"], out))
    first = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", spec, "--no-preflight"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in first.stdout:
        if "ready rank 0" in line:
            break
    second = mlaunch("submit", spec, "--no-preflight")
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr
    assert f"{out} is in use by run t-" in second.stderr and f"on {socket.gethostname()}" in second.stderr
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=limit(60))
    assert first.returncode == 130
    assert not os.path.exists(os.path.join(out, ".mlaunch.lock")), "lock not released"
    spec = write_spec(tmp_path, script_job(["localhost"], 1, "fail_or_sleep.py", ["0", "0", "0"], out),
                      "quick.yaml")
    # A launcher that died without unlocking: same host, dead pid -> taken over, evidence kept.
    dead = subprocess.Popen(["true"])
    dead.wait()
    with open(os.path.join(out, ".mlaunch.lock"), "w") as fh:
        json.dump({"host": socket.gethostname(), "pid": dead.pid, "run_id": "old", "started": time.time()}, fh)
    r = mlaunch("submit", spec, "--no-preflight")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"took over a stale lock in {out}: launcher pid {dead.pid}" in r.stdout
    assert os.path.exists(os.path.join(out, ".mlaunch.lock.stale"))

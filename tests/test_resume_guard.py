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


def set_aside(out) -> dict[str, list[str]]:
    """output_dir/mlaunch-set-aside/: each attempt's folder (<run>-attempt<k>) and its files."""
    top = os.path.join(out, "mlaunch-set-aside")
    return {d: tree(os.path.join(top, d)) for d in os.listdir(top)} if os.path.isdir(top) else {}


def test_fresh_submit_refuses_existing_checkpoints(tmp_path):
    out = tmp_path / "out"
    checkpoint(out, 5)
    before = tree(out)
    r = mlaunch("submit", write_spec(tmp_path, lf_job(tmp_path, str(out))), "--no-preflight")
    assert r.returncode == 2
    assert f"{out} already holds checkpoints (latest complete: {out}/checkpoint-5); continue with --resume, or start over with --overwrite" in r.stderr
    assert not (tmp_path / "seen.yaml").exists(), "something started"
    assert tree(out) == before


def test_the_dry_run_on_this_machine_refuses_what_submit_refuses(tmp_path):
    """Nodes on this machine: output_dir is here, so the dry run looks as submit does and
    refuses a fresh start over its checkpoints (before, it passed and submit then refused);
    --overwrite and --resume pass, and nothing in output_dir changed."""
    out = tmp_path / "out"
    checkpoint(out, 5)
    before = tree(out)
    spec = write_spec(tmp_path, lf_job(tmp_path, str(out)))
    r = mlaunch("submit", spec, "--dry-run")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert r.stderr.strip() == (f"mlaunch: {out} already holds checkpoints; continue with --resume, or start "
                                "over with --overwrite (submit would refuse the same)"), r.stderr
    for flag in ("--overwrite", "--resume"):
        assert mlaunch("submit", spec, "--dry-run", flag).returncode == 0
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
    # checkpoint-10 is the step this run saves again: moved whole out of its way, nothing deleted
    (attempt, moved), = set_aside(out).items()
    assert attempt.endswith("-attempt0") and moved == ["checkpoint-10/adapter_model.safetensors"], moved
    assert f"output_dir: checkpoint-10 moved to {out}/mlaunch-set-aside/{attempt} before attempt 0" in r.stdout
    assert tree(out / "checkpoint-5") == ["adapter_model.safetensors", "trainer_state.json"]
    assert not (out / "checkpoint-10").exists()


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
    assert [files for files in set_aside(out).values()] == [["checkpoint-10/adapter_model.safetensors"]]


def test_overwrite_renders_overwrite(tmp_path):
    out = tmp_path / "out"
    checkpoint(out, 5)
    r = mlaunch("submit", write_spec(tmp_path, lf_job(tmp_path, str(out))), "--overwrite", "--no-preflight")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load((tmp_path / "seen.yaml").read_text())["overwrite_output_dir"] is True
    # the older run's checkpoint: kept whole, out of the new run's way
    assert list(set_aside(out).values()) == [["checkpoint-5/adapter_model.safetensors",
                                              "checkpoint-5/trainer_state.json"]]
    assert not (out / "checkpoint-5").exists()


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


def _preflight_that_waits_for_the_lock(out, seen: dict, fail: bool):
    """A stand-in for submit's preflight: it notes whether output_dir's lock was taken while it
    ran (node 0's lock and checkpoint scan run beside the preflight), then passes or fails."""
    from launcher.errors import UserError

    def preflight(plan, executor, printer):
        end = time.monotonic() + limit(30)
        while not (out / ".mlaunch.lock").exists() and time.monotonic() < end:
            time.sleep(0.01)
        seen["locked during preflight"] = (out / ".mlaunch.lock").exists()
        if fail:
            raise UserError("preflight failed (table above); fix it, or skip with --no-preflight")
        return None
    return preflight


@pytest.mark.parametrize("fail", [True, False], ids=["preflight-fails", "checkpoints-refused"])
def test_the_lock_is_taken_beside_the_preflight_and_a_refusal_gives_it_back(tmp_path, monkeypatch, capsys, fail):
    """output_dir's lock and checkpoint scan are two round trips to node 0 made while the
    preflight runs, not after it. A refusal still comes in the old order (the failed
    preflight first; else the checkpoints already there) and gives the lock back. It leaves
    output_dir as it was: the checkpoint there untouched; a failed preflight of a new
    output_dir (two folders deep) leaves no folder the lock made."""
    from launcher.cli.main import main
    from launcher.runs import attempts
    out = tmp_path / "new" / "out" if fail else tmp_path / "out"
    if not fail:
        checkpoint(out, 5)
    spec = write_spec(tmp_path, lf_job(tmp_path, str(out)))
    before = tree(tmp_path)
    seen: dict = {}
    monkeypatch.setattr(attempts, "_preflight", _preflight_that_waits_for_the_lock(out, seen, fail))
    with pytest.raises(SystemExit) as e:
        main(["submit", spec])
    err = capsys.readouterr().err
    assert e.value.code == 2 and seen == {"locked during preflight": True}, (seen, err)
    why = "preflight failed (table above)" if fail else f"{out} already holds checkpoints (latest complete: "
    assert f"mlaunch: {why}" in err and err.count("mlaunch: ") == 1, err
    assert not (out / ".mlaunch.lock").exists()
    assert tree(tmp_path) == before and not (tmp_path / "new").exists()   # nothing started, nothing left


def test_unlock_drops_only_the_empty_folders_its_lock_made(tmp_path):
    """outdir's lock names the folders it made; unlock's drop (a refused submit) removes those
    still empty, deepest first, and never one that held something before or now."""
    from launcher.nodeprog import outdir
    (tmp_path / "a").mkdir()
    out = tmp_path / "a" / "b" / "c"
    assert outdir.lock(str(out), "h", os.getpid(), "r1")["ok"]
    (tmp_path / "a" / "b" / "kept.txt").write_text("written meanwhile")
    assert outdir.unlock(str(out), "r1", drop=True)
    assert not out.exists() and (tmp_path / "a" / "b" / "kept.txt").exists()
    assert outdir.lock(str(out), "h", os.getpid(), "r2")["ok"]
    assert not outdir.unlock(str(out), "other", drop=True) and out.exists()   # not its lock: nothing
    assert outdir.unlock(str(out), "r2") and out.exists()   # no drop: the run's folders stay


def test_unlock_drops_no_folder_outside_output_dirs_own_path(tmp_path):
    """The folders to drop are read from the lock file; one that names a folder elsewhere
    (an edited or planted lock) gets only output_dir's own path emptied."""
    from launcher.nodeprog import outdir
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    assert outdir.lock(str(out), "h", os.getpid(), "r1")["ok"]
    lock = out / ".mlaunch.lock"
    held = json.loads(lock.read_text())
    lock.write_text(json.dumps(held | {"made": [str(elsewhere), str(out)]}))
    assert outdir.unlock(str(out), "r1", drop=True)
    assert elsewhere.is_dir() and not out.exists()

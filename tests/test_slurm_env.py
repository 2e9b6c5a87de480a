"""Slurm's clients export the launcher's whole environment into the job by default, where
slurmctld stores it (and slurmdbd with AccountingStoreFlags=job_env: `sacct --env-vars`): no
secret-named variable of this shell reaches sbatch, salloc or srun. The nodes get cluster.env's
secrets from a 0600 file instead."""
from __future__ import annotations

import subprocess
from types import SimpleNamespace

from launcher.backends.slurm import alloc, commands, executor


def test_slurm_clients_run_without_this_shells_secrets(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_launcher_secret")
    monkeypatch.setenv("WANDB_API_KEY", "wandb_launcher_secret")
    monkeypatch.setenv("MLAUNCH_PLAIN", "kept")
    r = commands.slurm_cmd(["/usr/bin/env"])   # the function every sbatch, squeue, scancel goes through
    assert r.returncode == 0
    assert "launcher_secret" not in r.stdout
    assert "MLAUNCH_PLAIN=kept" in r.stdout and "PATH=" in r.stdout


def test_salloc_and_srun_get_the_same_environment(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_launcher_secret")
    seen = []

    def run(argv, **kw):
        seen.append(kw.get("env"))
        return subprocess.CompletedProcess(argv, 1, "", "salloc: error: refused")
    monkeypatch.setattr(subprocess, "run", run)
    a = alloc.AllocationExecutor.__new__(alloc.AllocationExecutor)
    a.job, a.job_id = SimpleNamespace(), "7"
    monkeypatch.setattr(alloc, "salloc_argv", lambda job: ["salloc"])
    monkeypatch.setattr(alloc, "sbatch_error", lambda text: text)
    a.connect()
    monkeypatch.setattr(a, "_srun", lambda host: ["srun"], raising=False)
    a.run("n1", "true", 5)
    ex = executor.SlurmExecutor.__new__(executor.SlurmExecutor)
    monkeypatch.setattr("launcher.backends.slurm.sbatch.step_argv", lambda plan, name: ["srun"])
    ex.run_step(None, "step", "true", 5)
    assert len(seen) == 3 and all(e is not None and "HF_TOKEN" not in e and "PATH" in e for e in seen)


def test_the_variables_a_specs_references_read_stay_out_of_slurm(monkeypatch, tmp_path):
    """HF_TOKEN: ${MY_HF} and DATA_URL: ${DATA_URL} (a password in it): the shell's MY_HF and
    DATA_URL are secrets under names of the user's choosing; sbatch exported them into the job,
    where slurmctld keeps them. PATH read by a reference stays (the clients need it)."""
    import yaml
    from launcher.spec import load_spec
    from launcher.spec.secret_rules import REF_SOURCES
    monkeypatch.setenv("MY_HF", "hf_from_a_plain_name")
    monkeypatch.setenv("DATA_URL", "https://u:pw_in_url@db.example/x")
    from .helpers import script_job
    spec = script_job(["localhost"], 1, "steps.py", ["3"], str(tmp_path / "out"))
    spec["cluster"]["env"] = {"HF_TOKEN": "${MY_HF}", "DATA_URL": "${DATA_URL}", "MY_PATH": "${PATH}"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    before = set(REF_SOURCES)
    try:
        load_spec(str(path))
        r = commands.slurm_cmd(["/usr/bin/env"])
    finally:
        REF_SOURCES.clear()
        REF_SOURCES.update(before)
    assert r.returncode == 0
    assert "hf_from_a_plain_name" not in r.stdout and "pw_in_url" not in r.stdout
    assert "\nPATH=" in "\n" + r.stdout

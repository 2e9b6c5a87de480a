"""The executor of a Slurm plan: login-node helpers, and one attempt as one batch job
(sbatch, then follow the per-node logs until it ends). The scheduler commands it uses live in
commands.py; following a job in follow.py."""
from __future__ import annotations

import os
import shutil
import subprocess

from ...errors import Problem, UserError
from ...record import fsmode, phases
from ...record.events import EventLog
from ...transport.base import make_run_dirs
from .commands import NO_ANSWER, client_env, sbatch_error, slurm_cmd


class SlurmExecutor:
    """Executor of a Slurm plan: login-node helpers, and one batch job per attempt."""

    def __init__(self) -> None:
        self.job_ids: list[str] = []

    def connect(self) -> list[Problem]:
        if not shutil.which("sbatch"):
            return [Problem("cluster.scheduler", "slurm: sbatch is not on PATH; run mlaunch on a "
                            "Slurm login node (or set scheduler: ssh)")]
        r = slurm_cmd(["scontrol", "ping"], timeout=20)
        if r.returncode != 0 or "UP" not in r.stdout:
            text = (r.stdout + r.stderr).strip().replace("\n", "; ")
            return [Problem("cluster.scheduler", f"slurm: the controller does not answer "
                            f"(scontrol ping: {text}); check SLURM_CONF / slurmctld")]
        return []

    def stage(self, plan) -> None:
        """The rendered files, on the shared storage every node reads."""
        make_run_dirs(self.run, "login node", plan)
        for f in plan.files:
            _write(f.path, f.content)

    def run(self, host: str, script: str, timeout: float) -> tuple[int, str]:
        """A helper script on the login node (it sees output_dir on shared storage)."""
        try:
            done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            return 124, str(e.stdout or "")
        return done.returncode, done.stdout + done.stderr

    def run_step(self, plan, name: str, script: str, timeout: float) -> tuple[int, str]:
        """script in a one-node Slurm job of its own (plan/sbatch.step_argv); (exit, output).
        srun waits for the allocation, so timeout covers the queue too."""
        from . import sbatch
        try:
            done = subprocess.run(sbatch.step_argv(plan, name), input=script, capture_output=True,
                                  text=True, timeout=timeout, env=client_env())
        except OSError as e:
            return 127, f"srun: {e.strerror or e}"
        except subprocess.TimeoutExpired as e:
            return 124, str(e.stdout or "")
        return done.returncode, done.stdout + done.stderr

    def drop_logs(self, dirs: dict[str, list[str]]) -> None:
        """Nothing: the batch job has ended; its torchrun logs stay in its run directory, with
        its other files, on the shared disk."""

    def close(self) -> None:
        pass

    def run_plan(self, plan, printer, on_started):
        """One attempt: submit, follow the per-node logs until the job ends; its JobResult."""
        from .follow import Follow
        from . import sbatch
        req = sbatch.request(plan)
        events = EventLog(os.path.join(plan.log_dir, "events.jsonl"), plan.run_id, plan.attempt)
        events.emit(phases.PHASE, phase="stage")
        self.stage(plan)
        _write(req.node_script.path, req.node_script.content)
        fsmode.private_dir(os.path.dirname(req.raw_log(0, "")))   # srun's unmasked output
        if req.secrets:
            _write_secret(req.secrets.path, req.secrets.content)
        _write(req.script_path, req.script)
        try:
            r = slurm_cmd(["sbatch", "--parsable", req.script_path], timeout=60)
            if r.returncode == NO_ANSWER:   # it may have queued the job all the same
                raise UserError(f"cluster.scheduler: {r.stderr}: sbatch may have queued "
                                f"{req.script_path} without saying so; check `squeue --me` and "
                                "scancel it before submitting again")
            if r.returncode != 0:
                raise sbatch_error(r.stderr or r.stdout)
            job_id = r.stdout.strip().split(";")[0]
            self.job_ids.append(job_id)
            n = len(plan.nodes)
            printer.say(f"slurm job {job_id}: {n} node{'' if n == 1 else 's'} requested; "
                        f"batch script {req.script_path}")
            # until the allocation runs (follow.py's rendezvous mark): the time in Slurm's queue
            events.emit(phases.PHASE, phase="queued", slurm_job=job_id)
            on_started(queued=True, handle={"job_id": job_id, "job_ids": list(self.job_ids)})
            return Follow(plan, req, job_id, printer, on_started).run()
        finally:
            if req.secrets:
                _remove(req.secrets.path)


def _write(path: str, text: str) -> None:
    run_dir = os.path.dirname(path)   # <shared_dir>/.mlaunch/<user>/<id> (Slurm needs shared_dir)
    fsmode.user_dir(os.path.dirname(run_dir))
    fsmode.private_dir(run_dir)
    fsmode.write_private(path, text)


def _write_secret(path: str, text: str) -> None:
    """A 0600 file in a 0700 directory, created with those modes (never readable first)."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    os.chmod(os.path.dirname(path), 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

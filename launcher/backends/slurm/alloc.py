"""`mlaunch check` on a Slurm spec: the checklist through srun inside one allocation.

`salloc --no-shell` asks for the spec's nodes (same partition, account, ... as the job);
every probe and the all-reduce then run as `srun --jobid --overlap -w <node>` steps, so the
preflight sees the nodes, software, ports and storage the job will get. The ssh row
becomes the allocation row. The allocation is cancelled when the check ends.
"""
from __future__ import annotations

import posixpath
import secrets

import os
import re
import shutil
import subprocess
import tempfile
import time

from ... import render
from ...errors import Problem
from ...plan.launch_plan import user_base
from ...record import fsmode
from ...transport.local import LocalExecutor, LocalRunning, start_relayed
from .commands import cancel_and_wait, client_env, hostnames, job_info, sbatch_error

ALLOC_WAIT_S = 300.0   # how long check waits for the allocation to start


def salloc_argv(job) -> list[str]:
    """salloc of the job's own allocation (the options sbatch gets: templates/slurm_salloc.j2)."""
    s = job.cluster.slurm
    options = [(k, getattr(s, k)) for k in ("partition", "account", "qos", "time",
                                            "constraint", "reservation") if getattr(s, k)]
    options += [("exclusive", None)] if s.exclusive else []
    options += [(k.lstrip("-"), None if v is True else v) for k, v in s.extra_sbatch.items()]
    return render.argv_lines("slurm_salloc.j2", nodes=s.nodes, job_name=job.name, options=options)


class AllocationExecutor(LocalExecutor):
    """An executor whose hosts are the nodes of one Slurm allocation, reached with srun."""

    def __init__(self, job, scratch: str):
        self.job, self.scratch = job, scratch
        self.job_id: str | None = None
        self.hosts: list[str] = []

    def connect(self) -> list[Problem]:
        r = subprocess.run(salloc_argv(self.job), capture_output=True,
                           text=True, timeout=ALLOC_WAIT_S, stdin=subprocess.DEVNULL, env=client_env())
        m = re.search(r"Granted job allocation (\d+)", r.stderr + r.stdout)
        if r.returncode != 0 or not m:
            err = sbatch_error(r.stderr or r.stdout)
            return [Problem("", str(err).replace("sbatch refused the job", "salloc refused the allocation"))]
        self.job_id = m.group(1)
        deadline = time.monotonic() + ALLOC_WAIT_S
        while (info := job_info(self.job_id)).get("JobState") != "RUNNING":
            if time.monotonic() > deadline or not info:
                return [Problem("cluster.slurm", f"allocation {self.job_id} did not start in "
                                f"{ALLOC_WAIT_S:g}s ({info.get('Reason', 'gone')})")]
            time.sleep(0.2)
        self.hosts = hostnames(info.get("NodeList", ""))
        return []

    def _srun(self, host: str) -> list[str]:
        return render.argv_lines("slurm_overlap.j2", job_id=self.job_id, host=host)

    def run(self, host: str, script: str, timeout: float) -> tuple[int, str]:
        # The script travels on stdin (`sh -s`), never on a command line.
        try:
            done = subprocess.run([*self._srun(host), "/bin/sh", "-s"], input=script,
                                  capture_output=True, text=True, timeout=timeout, env=client_env())
        except subprocess.TimeoutExpired as e:
            return 124, str(e.stdout or "")
        return done.returncode, done.stdout + done.stderr

    def start(self, node) -> LocalRunning:
        # stdin stays the hang-up line (srun forwards it), so the script goes in a 0600 file.
        fd, path = tempfile.mkstemp(prefix=f"node{node.rank}-", suffix=".sh", dir=self.scratch)
        with os.fdopen(fd, "w") as fh:
            fh.write(node.script)
        return start_relayed([*self._srun(node.host), "/bin/sh", path], self.relay_head(), b"", client_env())

    def close(self) -> None:
        if self.job_id:
            cancel_and_wait(self.job_id, timeout=60)
        shutil.rmtree(self.scratch, ignore_errors=True)


def scratch_dir(job, purpose: str) -> str:
    """A private folder for one check or exec under <shared_dir>/.mlaunch/<user>."""
    mine = fsmode.user_dir(user_base(job))
    return fsmode.private_dir(posixpath.join(mine, f"{purpose}-{secrets.token_hex(4)}"))


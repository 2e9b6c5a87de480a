"""Helpers for the Slurm backend tests: specs for the slurm2 cluster, the CLI against it."""
from __future__ import annotations

import os
import sys
import time

from .helpers import SCRIPTS, free_port, limit, mlaunch, write_spec
from .test_fanout import job_pids


def slurm_cluster(tmp_path, nproc: int = 2, nodes: int = 2, **slurm) -> dict:
    """The cluster block of a job on the slurm2 cluster (shared storage under tmp_path)."""
    return {"scheduler": "slurm", "slurm": {"nodes": nodes, **slurm}, "gpus_per_node": nproc,
            "python": sys.executable, "master_port": free_port(),
            "shared_dir": str(tmp_path / "shared")}


def slurm_script_job(tmp_path, script: str, args: list[str], *, nproc: int = 2, **cluster) -> dict:
    spec = {"name": "t", "trainer": "script",
            "cluster": {**slurm_cluster(tmp_path, nproc), **cluster},
            "script": {"path": os.path.join(SCRIPTS, script), "args": args},
            "output_dir": str(tmp_path / "out")}
    return spec


def submit(cluster, tmp_path, spec: dict, *args: str, timeout: float = 300, **kw):
    """`mlaunch submit` of spec against cluster (its SLURM_CONF)."""
    env = {"SLURM_CONF": cluster.conf, **kw.pop("env", {})}
    return mlaunch("submit", write_spec(tmp_path, spec), *args, env=env, timeout=timeout, **kw)


def baseline(cluster) -> list[set[int]]:
    """Each node namespace's processes before a job: slurmd, sshd (never job processes)."""
    return [job_pids(h, set()) for h in cluster.hs.hosts]


def leftovers(cluster, keep: list[set[int]]) -> dict[str, set[int]]:
    """Processes in each node namespace beyond the baseline: the job's, if any."""
    return {h.name: job_pids(h, k) for h, k in zip(cluster.hs.hosts, keep)}


def wait_until(cond, timeout: float = 120, what: str = "") -> None:
    deadline = time.monotonic() + limit(timeout)
    while not cond():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.2)


def drain_and_kill(cluster, name: str) -> None:
    """Node `name` fails under a job: drained in Slurm, then every rank on it killed."""
    import signal
    cluster.run(["scontrol", "update", f"nodename={name}", "state=drain", "reason=test"])
    host = next(h for h in cluster.hs.hosts if h.name == name)
    ranks = [p for p in host.pids() if environ_has(p, b"RANK=")]
    assert ranks, f"no rank of the job on {name}"
    for pid in ranks:
        os.kill(pid, signal.SIGKILL)


def environ_has(pid: int, entry: bytes) -> bool:
    """Whether process pid's environment has an entry starting with entry."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return any(e.startswith(entry) for e in fh.read().split(b"\0"))
    except OSError:
        return False

"""Small shared helpers for the test suite (no fixtures here; see conftest.py)."""
from __future__ import annotations

import copy
import os
import subprocess
import sys

import yaml

from .loadfactor import limit  # noqa: F401  (re-exported: every test's wait limits)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")
SEED000 = os.path.join(CONFIGS, "seed000-qwen2-7b-lora.yaml")


def load_yaml(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def seed000() -> dict:
    """A fresh, mutable copy of seed 000's spec."""
    return copy.deepcopy(load_yaml(SEED000))


class _Delete:
    """set_path's value that removes the key; a fixed repr keeps parametrized test ids stable
    across processes (pytest-xdist requires every worker to collect the same ids)."""

    def __repr__(self) -> str:
        return "DELETE"


DELETE = _Delete()


def set_path(data: dict, path: str, value) -> dict:
    """data with the dotted key path set to value (parents created), or removed for DELETE."""
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return data


def check_golden(folder: str, got: dict[str, str]) -> None:
    """The rendered files `got` (name -> text) are exactly the golden files in folder;
    MLAUNCH_UPDATE_GOLDEN=1 rewrites the folder from them first."""
    if os.environ.get("MLAUNCH_UPDATE_GOLDEN"):
        os.makedirs(folder, exist_ok=True)
        for name, text in got.items():
            with open(os.path.join(folder, name), "w", encoding="utf-8") as fh:
                fh.write(text)
    assert sorted(os.listdir(folder)) == sorted(got), "golden file set differs"
    for name, text in got.items():
        with open(os.path.join(folder, name), encoding="utf-8") as fh:
            assert text == fh.read(), f"{folder}/{name} differs from golden"


def preflight(spec: dict, fast_only: bool = True):
    """The preflight Report of spec's job on its hosts (every host must connect)."""
    from launcher.backends import backend_of
    from launcher.plan.launch_plan import build_plan
    from launcher.preflight import run_checks
    from launcher.spec import validate
    plan = build_plan(validate(spec))
    ex = backend_of(plan.job).transport(plan)
    assert ex.connect() == []
    try:
        return run_checks(plan, ex, fast_only=fast_only)
    finally:
        ex.close()


def write_spec(tmp_path, data: dict, name: str = "job.yaml") -> str:
    path = os.path.join(str(tmp_path), name)
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)
    return path


def mlaunch(*args: str, cwd: str | None = None, env: dict | None = None, timeout: float = 120,
            **kw) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("MLAUNCH_DEBUG", None) if not (env and "MLAUNCH_DEBUG" in env) else None
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd or ROOT,
                          env=full_env, capture_output=True, text=True, timeout=limit(timeout),
                          **kw)

SCRIPTS = os.path.join(ROOT, "tests", "scripts")


def script_job(hosts: list[str], nproc: int, script: str, args: list[str], out_dir: str, *,
               hs=None, **cluster) -> dict:
    """A `trainer: script` job spec over the given hosts (SSH settings from a HostSet)."""
    spec = {"name": "t", "trainer": "script",
            "cluster": {"hosts": hosts, "gpus_per_node": nproc, "python": sys.executable,
                        "master_port": free_port(), **cluster},
            "script": {"path": os.path.join(SCRIPTS, script), "args": args},
            "output_dir": out_dir}
    if hs is not None:
        spec["cluster"].setdefault("ssh", ssh_of(hs, SSH_CONNECT_S))
    return spec


# cluster.ssh.connect_timeout of the test jobs: short, so that a test of a dead or frozen host
# waits little, and scaled to the load, so that a live sshd on two busy cores is not taken for
# a frozen one. Tests that check the timeout's words use this value.
SSH_CONNECT_S = max(3, round(limit(3)))


def python_with_smi(folder, smi_script: str) -> str:
    """cluster.python for a job on CPU hosts that look like GPU hosts: folder/bin holds this
    Python, its torchrun and tests/scripts/<smi_script> as nvidia-smi."""
    import shutil
    bindir = os.path.join(folder, "bin")
    os.makedirs(bindir)
    os.symlink(sys.executable, os.path.join(bindir, "python"))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    os.symlink(torchrun if os.path.exists(torchrun) else shutil.which("torchrun"),
               os.path.join(bindir, "torchrun"))
    os.symlink(os.path.join(SCRIPTS, smi_script), os.path.join(bindir, "nvidia-smi"))
    return os.path.join(bindir, "python")


def ssh_of(hs, connect_timeout: int) -> dict:
    """cluster.ssh for the namespace hosts of HostSet hs: root, with the fixture's key."""
    return {"user": "root", "key_file": hs.key_file, "known_hosts": hs.known_hosts,
            "connect_timeout": connect_timeout}


def free_port() -> int:
    """A master port for a test job: below the kernel's ephemeral range (32768-60999 here),
    where outgoing connections (ssh, gloo, store clients) take theirs and once took 34724 from
    a test; in a band of its own per pytest-xdist worker; and free on this host right now."""
    import random
    import socket
    n, count = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:], os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")
    band = 12000 // max(1, int(count) if count.isdigit() else 1)
    lo = 20000 + (int(n) if n.isdigit() else 0) * band % 12000
    for _ in range(50):
        port = random.randint(lo, lo + band - 1)
        with socket.socket() as s:
            try:
                s.bind(("", port))
                return port
            except OSError:
                continue
    return port


class _Transport:
    """A backend's transport(plan) for tests that drive spares.reconnect: fn is what the test
    sets (monkeypatch.setattr(TRANSPORT, "fn", lambda plan: FakeExecutor(...)))."""

    def fn(self, plan):
        raise AssertionError("the test set no transport")

    def __call__(self, plan):
        return self.fn(plan)


TRANSPORT = _Transport()


def plan_of(job, **kw):
    """The plan of job as its backend makes it (a scheduler's placement included)."""
    from launcher.backends import backend_of
    return backend_of(job).plan(job, **kw)

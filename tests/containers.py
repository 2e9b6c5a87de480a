"""The container tests' image and helpers: podman on this machine (tests/env/podman_here.sh),
the trainer image built from the CPU trainer venv (tests/env/make_trainer_image.sh, cached
by its inputs), and what a test checks on each namespace host after a run."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time

import pytest

from .helpers import ROOT
from .loadfactor import limit

PODMAN = os.path.join(ROOT, "tests", "env", "podman_here.sh")
BUILDER = os.path.join(ROOT, "tests", "env", "make_trainer_image.sh")
IMAGE_PYTHON = "/opt/trainer/bin/python"   # the venv's interpreter inside the image


def require_podman() -> None:
    """Skip unless podman can run here (root; Debian's podman from run-tests.sh's apt list)."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (run-tests.sh installs Debian's podman)")
    if os.geteuid() != 0:
        pytest.skip("the container tests run podman as root on namespace hosts")


def build_image(venv: str) -> str:
    """The trainer image's name, built (or found in podman's storage) from venv."""
    require_podman()
    r = subprocess.run(["bash", BUILDER, venv], capture_output=True, text=True, timeout=limit(1800))
    if r.returncode != 0:
        pytest.fail(f"building the trainer image failed: {r.stderr[-3000:]}")
    return r.stdout.strip().splitlines()[-1]


def container_block(image: str, *mounts: str, **extra) -> dict:
    """cluster.container for a test job on CPU namespace hosts: this machine's podman wrapper,
    no GPUs, the repository (the test scripts) and the test's own folders mounted."""
    return {"image": image, "command": [PODMAN], "gpus": False,
            "mounts": [f"{ROOT}:{ROOT}:ro", *[f"{m}:{m}" for m in mounts]], **extra}


def containers_on(host, run_id: str) -> list[str]:
    """The names of the run's containers in host's podman storage, whatever their state."""
    r = host.run([PODMAN, "ps", "-a", "--filter", f"name=^mlaunch-{run_id}-", "--format",
                  "{{.Names}}"], timeout=limit(60))
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def run_pids(run_id: str) -> set[int]:
    """This machine's processes (every namespace host's among them) whose environment holds
    the run's tag, any attempt's (MLAUNCH_RUN_ID=<id> or <id>+a<N>)."""
    out = set()
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(f"{d}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        tag = f"MLAUNCH_RUN_ID={run_id}".encode()
        if any(e == tag or e.startswith(tag + b"+a") for e in env):
            out.add(int(d[6:]))
    return out


def wait_nothing_left(hosts, run_id: str, timeout: float = 60) -> None:
    """Wait (bounded) until no process of the run is left on this machine and no container
    of it in any host's storage; fail naming what is left."""
    deadline = time.monotonic() + limit(timeout)
    while True:
        pids = run_pids(run_id)
        boxes = {h.name: containers_on(h, run_id) for h in hosts}
        if not pids and not any(boxes.values()):
            _forget_storage(hosts, boxes)
            return
        if time.monotonic() > deadline:
            cmds = {p: _cmdline(p) for p in sorted(pids)}
            pytest.fail(f"left by run {run_id}: processes {cmds}, containers {boxes}")
        time.sleep(0.5)


def _forget_storage(hosts, boxes: dict) -> None:
    """Remove the hosts' own container storage (tests/env/podman_here.sh) once none of their
    containers is left: a test host's storage is never used again after its test."""
    for h in hosts:
        if not boxes.get(h.name):
            for d in (f"/var/lib/mlh-containers/{h.name}", f"/run/mlh-containers/{h.name}"):
                shutil.rmtree(d, ignore_errors=True)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


def wait_for(paths: list[str], proc=None, timeout: float = 300) -> None:
    """Wait until every path exists; fail early if proc (a Popen) ended first."""
    deadline = time.monotonic() + limit(timeout)
    while not all(os.path.exists(p) for p in paths):
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"the run ended (exit {proc.returncode}) before {paths}: {out[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {paths}"
        time.sleep(0.2)


def files_holding(root: str, needle: str) -> list[str]:
    """Every file under root whose bytes contain needle, past the image's and the containers'
    file trees (overlay/: layers and merged roots, gigabytes of the image's own files)."""
    found = []
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("overlay", "overlay-layers", "merged", "diff")]
        for name in names:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            try:
                with open(path, "rb") as fh:
                    if needle.encode() in fh.read():
                        found.append(path)
            except OSError:
                pass
    return found

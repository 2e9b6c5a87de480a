"""Runs inside podman containers on namespace hosts (each host its own podman storage, the
image from the machine's: tests/env/podman_here.sh), through the real CLI: a secret enters
by name only; Ctrl-C, `stop` and a killed launcher each leave no container and no process
of the run on any host. The image is tests/env/make_trainer_image.sh's (Debian's python3.11
and the CPU trainer venv's packages), so these are training-marked: they need that venv."""
from __future__ import annotations

import hashlib
import os
import secrets
import signal
import stat
import subprocess
import sys

import pytest

from .containers import (IMAGE_PYTHON, build_image, container_block, containers_on, files_holding,
                         require_podman, wait_for, wait_nothing_left)
from .helpers import ROOT, script_job, write_spec
from .loadfactor import limit
from .test_secrets import CmdlineSampler
from .training import require_trainer

pytestmark = [pytest.mark.multihost, pytest.mark.training, pytest.mark.launches]


@pytest.fixture(scope="module")
def image():
    require_podman()
    python = require_trainer()
    return build_image(os.path.dirname(os.path.dirname(python)))


def probe_job(hs, image: str, tmp_path, **env) -> tuple[dict, str]:
    """container_probe.py on both hosts x 2 processes in the image; its marker folder."""
    markers = tmp_path / "markers"
    markers.mkdir()
    spec = script_job([h.ip for h in hs], 2, "container_probe.py", [str(markers)],
                      str(tmp_path / "out"), hs=hs, env={"OMP_NUM_THREADS": "1", **env})
    spec["cluster"]["python"] = IMAGE_PYTHON
    spec["cluster"]["container"] = container_block(image, str(tmp_path))
    spec["name"] = "box" + secrets.token_hex(3)
    return spec, str(markers)


def submit(tmp_path, spec: dict, *args: str, home: str | None = None) -> subprocess.Popen:
    """`mlaunch submit` in the foreground, SIGINT at its default (as in a terminal)."""
    env = {**os.environ, "MLAUNCH_HOME": home or str(tmp_path / "home")}
    env.pop("MLAUNCH_DEBUG", None)
    return subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", "--no-preflight", *args,
                             write_spec(tmp_path, spec)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def run_id_in(text: str) -> str:
    import re
    m = re.search(r"run (\S+): \d+ nodes", text) or re.search(r"\[mlaunch\] run (\S+):", text)
    assert m, text[-2000:]
    return m.group(1)


def others_can_read(path: str) -> bool:
    """path is readable by a user who is neither its owner nor in its group: the file o+r and
    every folder above it o+x."""
    if not os.stat(path).st_mode & stat.S_IROTH:
        return False
    d = os.path.dirname(path)
    while d and d != "/":
        if not os.stat(d).st_mode & stat.S_IXOTH:
            return False
        d = os.path.dirname(d)
    return True


def started(markers: str) -> list[str]:
    return [os.path.join(markers, f"started-{r}") for r in range(4)]


def test_secret_enters_by_name_and_ctrl_c_leaves_nothing(hosts2, image, tmp_path):
    """A canary secret in cluster.env reaches every rank inside its container (its sha256 in
    the rank's line), is on no command line on the machine while the job runs and in no file
    another user can read (the run's folders, each host's container storage and state); Ctrl-C
    then ends the run and leaves no container and no process of it on either host."""
    canary = "canary-" + secrets.token_hex(12)
    spec, markers = probe_job(hosts2, image, tmp_path, HF_TOKEN=canary)
    with CmdlineSampler(canary) as sampler:
        proc = submit(tmp_path, spec)
        wait_for(started(markers), proc)
        storage = [p for h in hosts2 for p in (f"/var/lib/mlh-containers/{h.name}",
                                                f"/run/mlh-containers/{h.name}")]
        readable = [f for root in [str(tmp_path), *storage] for f in files_holding(root, canary)
                    if others_can_read(f)]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=limit(120))
    assert sampler.rounds > 3 and sampler.hits == [], sampler.hits
    assert readable == [], readable
    digest = hashlib.sha256(canary.encode()).hexdigest()
    assert out.count(f"HF_TOKEN sha256 {digest} in container yes") == 4, out[-3000:]
    assert canary not in out
    assert proc.returncode == 130, out[-3000:]
    wait_nothing_left(hosts2, run_id_in(out))


def test_stop_of_a_detached_run_leaves_nothing(hosts2, image, tmp_path):
    """`mlaunch stop` of a run detached with submit -d: no container, no process left."""
    from .runs import Runs
    spec, markers = probe_job(hosts2, image, tmp_path)
    runs = Runs(str(tmp_path / "home"))
    run_id = runs.detach(tmp_path, spec)
    wait_for(started(markers))
    assert all(containers_on(h, run_id) for h in hosts2)   # one per host while it runs
    r = runs.cli("stop", run_id, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    runs.wait_state(run_id, ("stopped", "failed"), timeout=120)
    wait_nothing_left(hosts2, run_id)


def test_a_killed_launcher_leaves_nothing(hosts2, image, tmp_path):
    """The launcher SIGKILLed mid-run: each node's hang-up guard ends its processes and
    removes its container."""
    spec, markers = probe_job(hosts2, image, tmp_path)
    proc = submit(tmp_path, spec)
    wait_for(started(markers), proc)
    boxes = [containers_on(h, spec["name"]) for h in hosts2]
    assert all(len(b) == 1 for b in boxes), boxes
    run_id = boxes[0][0].removeprefix("mlaunch-").rsplit("-a0-n", 1)[0]
    proc.kill()
    proc.communicate(timeout=limit(60))
    wait_nothing_left(hosts2, run_id, timeout=90)

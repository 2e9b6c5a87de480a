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


def node_logs(out_dir: str) -> str:
    """The text of every node log of the runs under out_dir."""
    root = os.path.join(out_dir, "logs")
    return "".join(open(os.path.join(d, f), errors="replace").read() for d, _, fs in os.walk(root)
                   for f in sorted(fs) if f.startswith("node"))


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
    logs = node_logs(str(tmp_path / "out"))   # every line (the console may drop the last at Ctrl-C)
    assert logs.count(f"HF_TOKEN sha256 {digest} in container yes") == 4, logs[-3000:]
    assert canary not in out and canary not in logs
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


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from .training import build_tiny
    require_trainer()
    root = tmp_path_factory.mktemp("tiny")
    return {**build_tiny(str(root)), "root": str(root)}


def lf_in_image(tiny: dict, hs, image: str, out: str, tmp_path, max_steps: int = 10, **kw) -> dict:
    """The tiny LLaMA-Factory LoRA job of the training tests, each node's torchrun in the image."""
    from .training import lf_spec
    spec = lf_spec(tiny, [h.ip for h in hs.hosts], 1, out, hs=hs, max_steps=max_steps, save_steps=5, **kw)
    spec["cluster"]["python"] = IMAGE_PYTHON
    spec["cluster"]["container"] = container_block(image, tiny["root"], str(tmp_path))
    spec["name"] = "lfbox" + secrets.token_hex(3)
    return spec


def test_llamafactory_lora_in_containers_resumes_after_a_killed_worker(make_hostset, image, tiny, tmp_path):
    """Real LLaMA-Factory LoRA on 2 namespace hosts, each node's torchrun in a podman
    container: a worker on host 1 killed after checkpoint-5 makes one automatic restart
    (new containers) that resumes there; steps 6-20 have the losses of an uninterrupted run
    in the same image, and no container or process of either run is left."""
    from .training import (KILLED_OR_PEER, attempt_exit, held_at, losses, submit_timed, trainer_state,
                           worker_killed)
    ref_out, out = str(tmp_path / "ref"), str(tmp_path / "out")
    with make_hostset(2) as hs:
        ref = lf_in_image(tiny, hs, image, ref_out, tmp_path, max_steps=20)
        r = submit_timed(tmp_path, ref, timeout=900, preflight=True)   # preflight in the image passes
        assert "preflight" in r.stdout and r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
        hold = str(tmp_path / "hold")
        spec = held_at(lf_in_image(tiny, hs, image, out, tmp_path, max_steps=20, max_restarts=1, restart_backoff_s=1),
                       5, hold)
        with worker_killed(hs.hosts[1].pids, os.path.join(out, "checkpoint-5", "trainer_state.json"),
                           b"llamafactory.launcher", release=hold) as killed:
            r2 = submit_timed(tmp_path, spec, timeout=900)
        console = r2.stdout + r2.stderr
        assert killed, "no worker was killed"
        assert r2.returncode == 0, console[-4000:]
        assert attempt_exit(console, 0) in KILLED_OR_PEER and attempt_exit(console, 1) == 0, console[-3000:]
        assert f"resuming from {out}/checkpoint-5" in console
        got, want = losses(trainer_state(out)), losses(trainer_state(ref_out))
        assert trainer_state(out)["global_step"] == 20 and sorted(got) == list(range(1, 21))
        for step in range(6, 21):   # the 15 steps after the kill
            assert got[step] == pytest.approx(want[step], rel=1e-5, abs=1e-6), (step, got, want)
        for name in (ref["name"], spec["name"]):
            wait_nothing_left(hs.hosts, name)


PREFLIGHT_CASES = {
    "runtime missing": ({"command": ["/nonexistent/podman"]}, None,
                        "cluster.container: /nonexistent/podman is not installed on this node (runtime podman)",
                        "install podman there, or set cluster.container.command to its path"),
    "image missing, pull never": ({"image": "localhost/mlaunch-no-such-image:1", "pull": "never"}, None,
                                  "cluster.container.image: localhost/mlaunch-no-such-image:1 is not on this node and pull is never",
                                  "or set cluster.container.pull: missing"),
    "trainer missing in the image": ({}, "swift", "ms-swift", "install it in the image"),
}


def test_preflight_refuses_each_container_problem_in_one_line(hosts2, image, tiny, tmp_path):
    """submit's preflight, per node: the runtime is missing, the image is missing with
    pull: never, the image lacks the trainer (ms-swift is not in the test image): each a
    software/python row naming the problem and its fix, exit 2, nothing started."""
    from .training import lf_spec
    for label, (block, trainer, detail, fix) in PREFLIGHT_CASES.items():
        spec = lf_spec(tiny, [h.ip for h in hosts2], 1, str(tmp_path / "out"), hs=hosts2)
        if trainer == "swift":
            spec.update(trainer="swift", model_type="qwen2", max_length=64,
                        dataset=os.path.join(tiny["dataset_dir"], "tiny_alpaca.json"))
            for key in ("dataset_dir", "cutoff_len"):
                spec.pop(key)
        spec["cluster"]["python"] = IMAGE_PYTHON
        spec["cluster"]["container"] = {**container_block(image, tiny["root"]), **block}
        spec["name"] = "pfbox" + secrets.token_hex(3)
        env = {**os.environ, "MLAUNCH_HOME": str(tmp_path / "home")}
        env.pop("MLAUNCH_DEBUG", None)
        r = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", write_spec(tmp_path, spec)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit(300))
        out = r.stdout + r.stderr
        rows = [ln for ln in out.splitlines() if "✗ software/python on node0" in ln]
        assert r.returncode == 2 and len(rows) == 1 and detail in rows[0], (label, out[-3000:])
        assert fix in out.split(rows[0], 1)[1].splitlines()[1], (label, out[-3000:])
        assert "Traceback" not in out
        wait_nothing_left(hosts2, spec["name"])   # nothing started (and the hosts' storage forgotten)


def test_gloo_all_reduce_through_srun_podman_on_the_slurm_cluster(slurm2, image, tmp_path):
    """A script job under Slurm, each node's torchrun in `podman run` inside its srun task:
    the all-reduce sums right on all 4 ranks and no container is left on either node."""
    from .slurmjobs import slurm_script_job, submit as slurm_submit
    spec = slurm_script_job(tmp_path, "allreduce.py", [], python=IMAGE_PYTHON,
                            container={**container_block(image, str(tmp_path)), "runtime": "podman"},
                            env={"OMP_NUM_THREADS": "1"})
    spec["name"] = "srunbox" + secrets.token_hex(3)
    r = slurm_submit(slurm2, tmp_path, spec, "--no-preflight", timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    logs = os.path.join(str(tmp_path / "out"), "logs")
    text = "".join(open(os.path.join(d, f)).read() for d, _, fs in os.walk(logs) for f in fs
                   if f.startswith("node"))
    import re
    assert sorted(re.findall(r"rank (\d)/4 node \d sum 6 expected 6", text)) == ["0", "1", "2", "3"], text[-3000:]
    node_sh = [os.path.join(d, "node.sh") for d, _, fs in os.walk(str(tmp_path / "shared")) if "node.sh" in fs]
    assert node_sh and "podman_here.sh run --rm --name mlaunch-" in open(node_sh[0]).read()
    wait_nothing_left(slurm2.hs.hosts, spec["name"])


def test_a_hang_torn_down_by_the_watchdog_leaves_nothing(hosts2, image, tmp_path):
    """A rank that stops making steps inside its container: the hang watchdog dumps every
    rank's stack with the host's py-spy, ends the run (exit 124), and no container and no
    process of it is left on either host."""
    import shutil
    if not shutil.which("py-spy"):
        pytest.skip("py-spy is not installed on this machine (the hosts' stack dumps need it)")
    spec = script_job([h.ip for h in hosts2], 1, "health_job.py",
                      ["--steps", "30", "--hang-rank", "1", "--hang-step", "4"], str(tmp_path / "out"),
                      hs=hosts2, env={"OMP_NUM_THREADS": "1"})
    spec["cluster"]["python"] = IMAGE_PYTHON
    spec["cluster"]["container"] = container_block(image, str(tmp_path))
    spec["name"] = "hangbox" + secrets.token_hex(3)
    spec["health"] = {"hang_after_s": 10}
    proc = submit(tmp_path, spec)
    out, _ = proc.communicate(timeout=limit(300))
    assert proc.returncode == 124 and "hang" in out, out[-3000:]
    wait_nothing_left(hosts2, spec["name"])
    # The host's py-spy read both ranks inside their containers before the teardown.
    (run,) = os.listdir(str(tmp_path / "out" / "logs"))
    stacks = tmp_path / "out" / "logs" / run / "stacks" / "attempt0"
    assert sorted(os.listdir(stacks)) == ["node0-rank0.txt", "node1-rank1.txt"], out[-3000:]
    assert "health_job.py" in (stacks / "node1-rank1.txt").read_text()

"""A job of one process runs the trainer as llamafactory-cli does: in-process, no torchrun.

Teardown, logs, exit codes and restarts must work the same for that form.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from launcher.plan.launch_plan import build_plan
from launcher.spec import validate

from .loadfactor import limit
from .helpers import ROOT, write_spec
from .procs import job_pids, job_pids_left
from .training import (build_tiny, held_at, lf_spec, losses, require_trainer, submit_timed, trainer_state,
                       uninterrupted)

pytestmark = pytest.mark.training


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    require_trainer()
    return build_tiny(str(tmp_path_factory.mktemp("tiny")))


class JobWatch:
    """Samples the job's processes (by MLAUNCH_RUN_ID) every 100 ms; kills the trainer once
    `kill_when` exists, then releases the trainers a held_at(spec, step, release) spec holds."""

    def __init__(self, name: str, kill_when: str | None = None, release: str | None = None):
        self.name, self.kill_when, self.release = name, kill_when, release
        self.seen: dict[int, tuple[bytes, bytes]] = {}   # pid -> (cmdline, environ)
        self.killed: list[int] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.done.is_set():
            for pid in job_pids(f"{self.name}-"):
                try:
                    cmd = open(f"/proc/{pid}/cmdline", "rb").read()
                    env = open(f"/proc/{pid}/environ", "rb").read()
                except OSError:
                    continue
                self.seen.setdefault(pid, (cmd, env))
                if (self.kill_when and not self.killed and os.path.exists(self.kill_when)
                        and b"llamafactory.launcher" in cmd):
                    os.kill(pid, signal.SIGKILL)
                    self.killed.append(pid)
                    if self.release:
                        open(os.path.join(self.release, "release"), "w").close()
            self.done.wait(0.1)

    def trainers(self) -> list[tuple[bytes, bytes]]:
        return [v for v in self.seen.values() if b"llamafactory.launcher" in v[0]]


def test_world_of_one_trains_without_torchrun_and_restarts(tmp_path, tiny):
    name = "world1-" + secrets.token_hex(3)
    out = str(tmp_path / "out")
    # The trainer is held right after saving checkpoint-3 until the kill (tests/hold): on a
    # loaded machine its later steps could otherwise all end before the watcher saw the file.
    hold = str(tmp_path / "hold")
    spec = held_at(lf_spec(tiny, ["localhost"], 1, out, max_steps=12, save_steps=3, max_restarts=1,
                           restart_backoff_s=1, name=name), 3, hold)
    watch = JobWatch(name, kill_when=os.path.join(out, "checkpoint-3", "trainer_state.json"),
                     release=hold)
    watch.thread.start()
    try:
        r = submit_timed(tmp_path, spec)
    finally:
        watch.done.set()
        watch.thread.join()
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert watch.killed, "the trainer was never killed"
    assert "attempt 0: exit 137" in r.stdout
    resumed = re.search(rf"attempt 1: exit 0, resumed from {re.escape(out)}/checkpoint-(\d+)", r.stdout)
    assert resumed and int(resumed.group(1)) == 3, r.stdout[-3000:]
    state = trainer_state(out)
    assert state["global_step"] == 12 and sorted(losses(state)) == list(range(1, 13))
    assert os.path.exists(os.path.join(out, "adapter_model.safetensors"))
    # The restarted run trains the uninterrupted run's model: the same spec, not cut, has the
    # same loss at each of the 9 steps after checkpoint-3 (Adam's moments restored, or step 5 on
    # would differ) and at the 3 before it.
    got = losses(state)
    want = uninterrupted(tmp_path, lf_spec(tiny, ["localhost"], 1, str(tmp_path / "reference"),
                                           max_steps=12, save_steps=3))
    print(f"[losses] world 1 restarted from checkpoint-3: {got}; uninterrupted: {want}")
    for step in range(1, 13):
        assert got[step] == pytest.approx(want[step], rel=1e-5), (step, got, want)
    # In-process: no torchrun anywhere in the job, and no process-group environment.
    assert len(watch.trainers()) >= 2, "both attempts' trainers should have been seen"
    assert not [c for c, _ in watch.seen.values() if b"torchrun" in c], "torchrun ran"
    for _, env in watch.trainers():
        assert b"\0WORLD_SIZE=" not in b"\0" + env and b"\0LOCAL_RANK=" not in b"\0" + env
    logs = os.listdir(os.path.join(out, "logs", os.listdir(os.path.join(out, "logs"))[0]))
    assert sorted(n for n in logs if n.endswith(".log")) == ["node0-localhost.attempt1.log", "node0-localhost.log"]
    assert job_pids_left(f"{name}-", limit(10)) == set()


def test_world_of_one_ctrl_c_tears_down_exit_130(tmp_path, tiny):
    name = "world1int-" + secrets.token_hex(3)
    spec = lf_spec(tiny, ["localhost"], 1, str(tmp_path / "out"), max_steps=10000, save_steps=10000,
                   name=name)
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", write_spec(tmp_path, spec),
                             "--no-preflight"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:   # the trainer is stepping: LLaMA-Factory logs each step's loss
        if "'loss'" in line or '"loss"' in line or "{'loss" in line:
            break
    assert job_pids(f"{name}-"), "no job process"
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=limit(120))[0]
    assert proc.returncode == 130, rest
    deadline = time.monotonic() + limit(10)
    while job_pids(f"{name}-") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job_pids(f"{name}-") == set()


def base(tmp_path, **over) -> dict:
    spec = {"name": "w", "trainer": "llamafactory",
            "cluster": {"hosts": ["localhost"], "gpus_per_node": 1, "python": "/venv/bin/python3"},
            "model": "/m", "template": "qwen", "dataset": "d", "finetuning": {"type": "lora"},
            "batch": {"per_device": 1}, "training": {"learning_rate": 1e-4, "max_steps": 2},
            "output_dir": str(tmp_path / "o")}
    for key, value in over.items():
        if key in ("gpus_per_node", "torchrun", "hosts"):
            spec["cluster"][key] = value
        else:
            spec[key] = value
    return spec


@pytest.mark.parametrize("over, solo", [
    ({}, True),
    ({"torchrun": "always"}, False),
    ({"gpus_per_node": 2}, False),
    ({"hosts": ["localhost", "127.0.0.1"], "cuda_visible_devices": [[0], [1]]}, False),
    ({"deepspeed": {"stage": 2}}, False),
    # The HF Trainer refuses FSDP without a process group (seen on the H200: "Using fsdp only
    # works in distributed training"), so FSDP keeps torchrun even for one process.
    ({"fsdp": {"sharding": "full_shard"}}, False),
])
def test_which_jobs_run_in_process(tmp_path, over, solo):
    cvd = over.pop("cuda_visible_devices", None)
    spec = base(tmp_path, **over)
    if cvd:
        spec["cluster"]["cuda_visible_devices"] = cvd
    plan = build_plan(validate(spec), run_id="W")
    argv = plan.nodes[0].argv
    if solo:
        assert argv == ("/venv/bin/python3", "-m", "llamafactory.launcher", f"{plan.run_dir}/llamafactory.yaml")
        assert "without torchrun, as\n# llamafactory-cli does" in plan.nodes[0].script
    else:
        # Under DeepSpeed, mlaunch's entry script runs llamafactory.launcher (templates/llamafactory_entry.py.j2).
        entry = f"{plan.run_dir}/llamafactory_entry.py" if "deepspeed" in over else "llamafactory.launcher"
        assert argv[0] == "/venv/bin/torchrun" and entry in argv


def test_script_jobs_keep_torchrun(tmp_path):
    spec = {"name": "s", "trainer": "script", "cluster": {"hosts": ["localhost"], "gpus_per_node": 1},
            "script": {"path": "/x.py"}}
    assert build_plan(validate(spec), run_id="S").nodes[0].argv[0] == "torchrun"


def test_resume_of_a_real_finished_checkpoint_trains_nothing(tmp_path, tiny):
    """A real run's checkpoint-3 of max_steps 3, its final export removed (a rank killed
    after the last save): resume must not train step 4 (LLaMA-Factory 0.9.5 would)."""
    out = tmp_path / "out"
    spec = lf_spec(tiny, ["localhost"], 1, str(out), max_steps=3, save_steps=3, name="finished")
    r = submit_timed(tmp_path, spec)
    assert r.returncode == 0, r.stdout[-3000:]
    for entry in os.listdir(out):   # keep only what a killed run leaves: checkpoint-3 (and logs)
        if entry not in ("checkpoint-3", "logs"):
            path = out / entry
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    state = (out / "checkpoint-3" / "trainer_state.json").read_bytes()
    r = submit_timed(tmp_path, spec, "--resume", preflight=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert ("training already complete at checkpoint-3 (global_step 3 of max_steps 3): not training "
            f"again; the final weights are in {out}/checkpoint-3") in r.stdout
    assert sorted(os.listdir(out)) == ["checkpoint-3", "logs"], "something was trained or written"
    assert (out / "checkpoint-3" / "trainer_state.json").read_bytes() == state


def test_stack_dump_finds_the_in_process_rank(tmp_path):
    """Without torchrun there is no RANK: MLAUNCH_IN_PROCESS=1 marks the rank for py-spy."""
    from launcher import render
    from launcher.transport.local import LocalExecutor
    from launcher.watch.stacks import split_dump
    run_id = "w1stack-" + secrets.token_hex(3)
    env = {**os.environ, "MLAUNCH_RUN_ID": run_id, "MLAUNCH_IN_PROCESS": "1", "MLAUNCH_NODE_RANK": "0"}
    env.pop("RANK", None)
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"],
                            env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "up\n"   # in its sleep: py-spy finds it there
        pyspy = shutil.which("py-spy") or "py-spy"
        code, out = LocalExecutor().run("localhost", render.stack_dump_script(
            f"MLAUNCH_RUN_ID={run_id}", pyspy, native=False), 60)
    finally:
        proc.kill()
        proc.wait()
    ranks = split_dump(out)
    assert [(r.pid, r.node, r.rank) for r in ranks] == [(proc.pid, 0, 0)], out[-2000:]
    assert ranks[0].ok and "<module>" in ranks[0].top, ranks[0].text


@pytest.mark.parametrize("torchrun", ["auto", "always"])
def test_busy_master_port_matters_only_with_torchrun(tmp_path, torchrun):
    """In-process, nothing binds master_port: someone else's process on it is no failure."""
    import socket

    from launcher.backends import backend_of
    from launcher.preflight import run_checks
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    spec = base(tmp_path, torchrun=torchrun)
    spec["cluster"].update(master_port=holder.getsockname()[1], python=sys.executable)
    plan = build_plan(validate(spec))
    ex = backend_of(plan.job).transport(plan)
    try:
        ex.connect()
        report = run_checks(plan, ex, fast_only=True)
    finally:
        ex.close()
        holder.close()
    free, reach = report.get("network/port-free", 0), report.get("network/port-reachable", 0)
    if torchrun == "auto":
        assert (free.status, reach.status) == ("skip", "skip"), (free, reach)
        assert free.detail == "not needed: one process without torchrun binds no master_port"
    else:
        assert free.status == "fail" and "is in use by" in free.detail, free

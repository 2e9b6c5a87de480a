"""Helpers for the real-training tests: the trainer venv, the tiny model, LLaMA-Factory specs."""
from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from contextlib import contextmanager

import pytest

from .loadfactor import limit
from .helpers import ROOT, free_port, ssh_of

TRAINER_VENV = os.environ.get("MLAUNCH_TRAINER_VENV", os.path.join(ROOT, ".venvs", "trainer"))
TRAINER_PYTHON = os.path.join(TRAINER_VENV, "bin", "python")
# Packages that the trainer venv keeps off its default path (tests/env/make_trainer_venv.sh
# park_bitsandbytes): a test that needs one puts this folder on the job's PYTHONPATH.
OPTIONAL_PATH = os.path.join(TRAINER_VENV, "optional")
SWIFT_VENV = os.environ.get("MLAUNCH_SWIFT_VENV", os.path.join(ROOT, ".venvs", "swift"))
SWIFT_PYTHON = os.path.join(SWIFT_VENV, "bin", "python")


def _require_venv(venv: str, builder: str, what: str) -> str:
    """venv's python, or skip with the command that builds it."""
    python = os.path.join(venv, "bin", "python")
    if os.environ.get("MLAUNCH_TESTS_FAST"):  # run-tests.sh --fast builds no venv
        pytest.fail(f"this test needs the {what} venv: mark it @pytest.mark.training so that "
                    "run-tests.sh --fast leaves it out", pytrace=False)
    if not os.access(python, os.X_OK):
        pytest.skip(f"no {what} venv at {venv}: run `bash tests/env/{builder} "
                    f"{venv}` (.ci/run does)")
    return python


def require_trainer() -> str:
    return _require_venv(TRAINER_VENV, "make_trainer_venv.sh", "trainer")


def require_swift() -> str:
    return _require_venv(SWIFT_VENV, "make_swift_venv.sh", "ms-swift")


def build_tiny(dest: str) -> dict:
    """The tiny model and dataset in dest. Built with the trainer venv (it has transformers)
    once per machine and inputs, then copied: a build is a trainer-venv start-up of about
    5 s of CPU, and fifteen test modules ask for it (each gets its own copy to write in)."""
    python = require_trainer()
    src = os.path.join(ROOT, "tests", "tinymodel.py")
    cache = _tiny_cache(python, src)
    with open(cache + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # another xdist worker may be building it
        if not os.path.isfile(os.path.join(cache, "info.json")):
            tmp = cache + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            out = subprocess.run([python, src, os.path.join(tmp, "tiny")], capture_output=True,
                                 text=True, timeout=limit(300), check=True)
            with open(os.path.join(tmp, "info.json"), "w") as fh:
                fh.write(out.stdout)
            os.rename(tmp, cache)
    shutil.copytree(os.path.join(cache, "tiny"), dest, dirs_exist_ok=True)
    info = json.load(open(os.path.join(cache, "info.json")))
    built = info["root"]
    return {k: dest + v[len(built):] if isinstance(v, str) and v.startswith(built) else v
            for k, v in info.items()}


def _tiny_cache(python: str, src: str) -> str:
    """Where the tiny model built by python from src lies: keyed by tinymodel.py and by the
    venv's own input stamp (a rebuilt venv with other libraries builds it anew)."""
    h = hashlib.sha256(open(src, "rb").read())
    venv = os.path.dirname(os.path.dirname(python))
    h.update(os.path.realpath(venv).encode())
    for stamp in sorted(glob.glob(os.path.join(venv, ".*-venv.sha256"))):
        h.update(open(stamp, "rb").read())
    return os.path.join(tempfile.gettempdir(), f"mlaunch-tests-tiny-{h.hexdigest()[:16]}")


def lf_spec(tiny: dict, hosts: list[str], nproc: int, out_dir: str, *, hs=None,
            finetuning: dict | None = None, deepspeed: dict | None = None,
            max_steps: int = 6, save_steps: int = 3, **extra) -> dict:
    """A LLaMA-Factory job on the tiny model: CPU, fp32, per-device batch 2."""
    spec = {
        "name": "tiny", "trainer": "llamafactory",
        "cluster": {"hosts": hosts, "gpus_per_node": nproc, "python": TRAINER_PYTHON,
                    "master_port": free_port(), "env": {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                                                      "HF_DATASETS_OFFLINE": "1"}},
        "model": tiny["model"], "template": tiny["template"], "dataset": tiny["dataset"],
        "dataset_dir": tiny["dataset_dir"], "cutoff_len": 64,
        "finetuning": finetuning or {"type": "lora", "lora_rank": 4, "lora_target": "all"},
        **tiny_schedule(max_steps, save_steps),
        "output_dir": out_dir,
        **extra,
    }
    if deepspeed:
        spec["deepspeed"] = deepspeed
    if hs is not None:
        spec["cluster"]["ssh"] = ssh_of(hs, 5)
    return spec


def tiny_schedule(max_steps: int, save_steps: int) -> dict:
    """batch, precision and training of the tiny jobs: per-device batch 2, fp32, a constant
    learning rate and a fixed seed (a resumed run must match an uninterrupted one)."""
    return {"batch": {"per_device": 2, "grad_accum": 1}, "precision": "fp32",
            "training": {"learning_rate": 1.0e-3, "max_steps": max_steps, "save_steps": save_steps,
                         "logging_steps": 1, "lr_scheduler": "constant", "gradient_checkpointing": False,
                         "seed": 7}}


def trainer_state(out_dir: str) -> dict:
    with open(os.path.join(out_dir, "trainer_state.json")) as fh:
        return json.load(fh)


def losses(state: dict) -> dict[int, float]:
    """step -> loss from a trainer_state's log history."""
    return {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}


def logged(out_dir: str) -> list[tuple[int, float]]:
    """(step, loss) of each logging line the trainer wrote under out_dir, in write order:
    LLaMA-Factory's trainer_log.jsonl (appended on resume) or ms-swift's logging.jsonl of each
    v<N>-<timestamp>/ directory (a resume starts a new one), oldest first."""
    swift = sorted(glob.glob(os.path.join(out_dir, "v*-*", "logging.jsonl")),
                   key=lambda p: int(re.match(r"v(\d+)-", os.path.basename(os.path.dirname(p))).group(1)))
    rows = []
    for path in swift or [os.path.join(out_dir, "trainer_log.jsonl")]:
        try:
            with open(path) as fh:
                rows += [json.loads(ln) for ln in fh if ln.strip().endswith("}")]
        except OSError:
            pass
    return [(r["current_steps"] if "current_steps" in r else int(r["global_step/max_steps"].split("/")[0]),
             r["loss"]) for r in rows if "loss" in r]


def by_attempt(rows: list[tuple[int, float]], resumed: int | None = None) -> tuple[dict[int, float], dict[int, float]]:
    """logged() of a run restarted once, split where the step goes back: attempt 0's losses
    (up to the cut) and attempt 1's (from the resumed checkpoint on). Where attempt 0 was cut
    right after logging the step of the checkpoint it resumed from (resumed), no step goes
    back: attempt 1's rows begin at the first step past it (CI at dc552e9 took them for
    attempt 0's)."""
    cut = next((i for i in range(1, len(rows)) if rows[i][0] <= rows[i - 1][0]), None)
    if cut is None:
        cut = next((i for i, (step, _) in enumerate(rows) if resumed is not None and step > resumed), len(rows))
    return dict(rows[:cut]), dict(rows[cut:])


def submit_timed(tmp_path, spec: dict, *args: str, timeout: float = 600, preflight: bool = False):
    """`mlaunch submit` the spec through the real CLI, printing its wall time.

    preflight: keep submit's fast checks (off by default to keep the suite quick; the
    preflight tests cover them)."""
    import time
    from .helpers import mlaunch, write_spec
    t0 = time.monotonic()
    flags = [] if preflight else ["--no-preflight"]
    r = mlaunch("submit", write_spec(tmp_path, spec), *flags, *args, timeout=timeout)
    print(f"[wall] {os.environ.get('PYTEST_CURRENT_TEST', '').split(' ')[0]}: {time.monotonic() - t0:.1f}s")
    return r


def local_job_pids(name: str):
    """A pids() for kill_worker_when: this machine's processes of mlaunch runs of job `name`
    (never another job's, e.g. a second test run on the same machine)."""
    from .procs import job_pids
    return lambda: job_pids(f"{name}-")


HOLD = os.path.join(ROOT, "tests", "hold")


def held_at(spec: dict, step: int, where: str) -> dict:
    """spec, its trainer processes held right after saving checkpoint-`step` until the file
    where/release exists (tests/hold/sitecustomize.py): what a kill after that checkpoint
    needs so that the training cannot finish first. worker_killed(release=where) releases."""
    os.makedirs(where, exist_ok=True)
    spec["cluster"]["env"] = {**spec["cluster"].get("env", {}), "PYTHONPATH": HOLD,
                              "MLAUNCH_TEST_HOLD_AT": str(step), "MLAUNCH_TEST_HOLD_DIR": where}
    return spec


def exits_at(spec: dict, step: int, where: str) -> dict:
    """spec, its rank 0 ended (exit 1) right after logging step `step`, once per run (a marker
    in where): a failure between two saves, at the same step however fast the machine is."""
    os.makedirs(where, exist_ok=True)
    spec["cluster"]["env"] = {**spec["cluster"].get("env", {}), "PYTHONPATH": HOLD,
                              "MLAUNCH_TEST_EXIT_AT": str(step), "MLAUNCH_TEST_HOLD_DIR": where}
    return spec


def uninterrupted(tmp_path, spec: dict, timeout: float = 600) -> dict[int, float]:
    """step -> loss of spec run to its end through `mlaunch submit`: the uninterrupted
    reference a restarted, spared or shrunk run's curve is held to (spec's output_dir keeps its
    checkpoints for an optimizer-state comparison)."""
    r = submit_timed(tmp_path, spec, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return losses(trainer_state(spec["output_dir"]))


def cut_then_release(host, where: str) -> None:
    """The link of a namespace host cut, then the trainers held by held_at(where) released:
    the others go on into their next collective and block on that host."""
    host.link_down()
    open(os.path.join(where, "release"), "w").close()


@contextmanager
def worker_killed(pids, state_glob: str, module: bytes, **kw):
    """While the block runs, kill_worker_when(pids, state_glob, module, **kw) watches in a
    thread; yields the list of the pids it signalled (empty when the file never came)."""
    done, killed = threading.Event(), []
    watcher = threading.Thread(target=kill_worker_when, args=(pids, state_glob, module, done, killed),
                               kwargs=kw)
    watcher.start()
    try:
        yield killed
    finally:
        done.set()
        watcher.join()


KILLED_OR_PEER = (137, 1)
"""attempt 0's exit when one worker of a 2-node job is SIGKILLed: 137 when its torchrun reports
first (its worker's signal), 1 when the peer node's torchrun does (its rank's collective
failed on the closed connection): which node reaches the launcher first is a race."""


def attempt_exit(console: str, n: int) -> int:
    """The exit code the console's summary gives attempt n ("attempt 0: exit 137")."""
    m = re.search(rf"attempt {n}: exit (\d+)\b", console)
    assert m, console[-3000:]
    return int(m.group(1))


def kill_worker_when(pids, state_glob: str, module: bytes, done, killed: list, *,
                     sig: int = 9, local_rank: int = 0, release: str | None = None) -> None:
    """Once a file matching state_glob exists, send sig (default SIGKILL) to the worker of
    local_rank running module among pids() (e.g. one host's processes, or local_job_pids),
    then release the trainers a held_at(spec, step, release) spec holds.
    A world of one runs the trainer in-process without torchrun: no LOCAL_RANK, and its one
    trainer process is local rank 0."""
    try:
        _kill_worker_when(pids, state_glob, module, done, killed, sig, local_rank)
    finally:
        if release is not None:
            open(os.path.join(release, "release"), "w").close()


def _kill_worker_when(pids, state_glob, module, done, killed, sig, local_rank) -> None:
    import glob
    import time
    while not done.is_set() and not glob.glob(state_glob):
        time.sleep(0.05)
    trainers = []
    for pid in sorted(pids()):
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if module in cmd and b"torchrun" not in cmd:
            rank = next((e.split(b"=", 1)[1] for e in env if e.startswith(b"LOCAL_RANK=")), None)
            trainers.append((pid, rank, module in cmd.split(b"\0")))
    ranked = [pid for pid, rank, _ in trainers if rank == str(local_rank).encode()]
    alone = [pid for pid, _, argv in trainers if argv] if local_rank == 0 and all(
        rank is None for _, rank, _ in trainers) else []
    for pid in (ranked or alone)[:1]:
        os.kill(pid, sig)
        killed.append(pid)


def submit_and_cut(tmp_path, spec: dict, ready, cut, *args: str,
                   env: dict | None = None) -> tuple[int, str]:
    """`mlaunch submit` of spec; once ready (a glob that a file matches, e.g. a checkpoint's
    trainer_state.json, or a function that says so), cut(console so far) makes the failure
    under test; then waits for the run to end. Returns (exit code, the whole console). Fails
    if the run ends first."""
    is_ready = ready if callable(ready) else (lambda: glob.glob(ready))
    import sys
    import time
    from .helpers import write_spec
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", *args,
                             write_spec(tmp_path, spec)], cwd=ROOT, env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + limit(600)
        while not is_ready():
            assert proc.poll() is None, f"the run ended before {ready}: " + "".join(lines)[-3000:]
            assert time.monotonic() < deadline, f"timed out waiting for {ready}"
            time.sleep(0.2)
        cut("".join(lines))
        proc.wait(timeout=limit(900))
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(limit(60))
    return proc.returncode, "".join(lines)


ADAM_STATE = r"""
import glob, json, math, sys, torch
def walk(o, found):
    if isinstance(o, dict):
        if isinstance(o.get("state"), dict) and "param_groups" in o:
            found += [s for s in o["state"].values() if isinstance(s, dict) and "step" in s]
        for v in o.values():
            walk(v, found)
out = {}
for path in sorted(p for d in sys.argv[1:] for p in glob.glob(d + "/global_step*/*optim_states.pt")):
    found = []
    walk(torch.load(path, map_location="cpu", weights_only=False), found)
    moments = [s for s in found if "exp_avg" in s]
    norm = lambda k: math.sqrt(sum(float(s[k].double().pow(2).sum()) for s in moments))
    out[path.rsplit("/", 1)[1]] = {"steps": sorted({int(s["step"]) for s in found}), "numel":
                                   sum(s["exp_avg"].numel() for s in moments),
                                   "exp_avg": norm("exp_avg"), "exp_avg_sq": norm("exp_avg_sq")}
print(json.dumps(out))
"""


def adam_moments(*checkpoint_dirs: str, python: str | None = None) -> dict[str, dict]:
    """{optimizer shard file: its Adam steps, element count and the L2 norms of exp_avg and
    exp_avg_sq} of a DeepSpeed checkpoint, whose shards may lie in several directories (each
    node's own disk), read by one process: two runs that trained the same model with the same
    optimizer history hold the same moments, a restart that lost them (a fresh optimizer) holds
    other ones."""
    out = subprocess.run([python or require_trainer(), "-c", ADAM_STATE, *checkpoint_dirs], capture_output=True,
                         text=True, timeout=limit(120), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def same_optimizer_state(got: dict[str, dict], want: dict[str, dict], step: int, rel: float = 0.02) -> list[str]:
    """What differs between two adam_moments() of checkpoints saved at global step `step`
    (empty: the same): each shard's Adam step is `step`, its size is the reference's and its
    moments' norms are within rel of the reference's."""
    bad = [] if sorted(got) == sorted(want) else [f"shards {sorted(got)} != {sorted(want)}"]
    for name in sorted(set(got) & set(want)):
        g, w = got[name], want[name]
        if g["steps"] != [step] or g["numel"] != w["numel"]:
            bad.append(f"{name}: steps {g['steps']} (want [{step}]), {g['numel']} elements (want {w['numel']})")
        bad += [f"{name}: |{k}| {g[k]:.6g} vs {w[k]:.6g}" for k in ("exp_avg", "exp_avg_sq")
                if abs(g[k] - w[k]) > rel * abs(w[k])]
    return bad


def adam_steps(checkpoint_dir: str, python: str | None = None) -> dict[str, list[int]]:
    """{optimizer shard file: the distinct optimizer `step` values it holds} of a DeepSpeed
    checkpoint (its global_step*/ folder), read with python's torch (the trainer venv's by
    default): what a resumed Adam takes its bias correction from."""
    return {name: shard["steps"] for name, shard in adam_moments(checkpoint_dir, python=python).items()}

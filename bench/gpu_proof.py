"""GPU proof (issue 7): the same LLaMA-Factory job through mlaunch and by hand on 2 GPUs.

Parts (each appends one JSON line per run to OUTDIR/results.jsonl, then prints the tables):
  check   `mlaunch check`: GPU rows and the NCCL all-reduce bus bandwidth, against the same
          program started by torchrun by hand, alternating
  lora    LoRA via `mlaunch submit` (localhost executor, 1 node x 2 GPUs) against the same
          rendered YAML via torchrun by hand, alternating
  nodes2  the LoRA job as 2 nodes x 1 GPU on this one host (own CUDA_VISIBLE_DEVICES each),
          alternating with 1 x 2
  zero3   full fine-tuning with ZeRO-3 and the rendered ds_config (epochs + warmup_ratio, so
          the warmup key depends on the installed transformers)
  fault   kill -9 of a rank after the first checkpoint, max_restarts 1: the run must finish
          at max_steps from that checkpoint and leave no GPU memory held
Every run samples nvidia-smi for peak memory per GPU (one rank per GPU).

Usage, from the repo root of a machine with GPUs and LLaMA-Factory:
    python3 bench/gpu_proof.py OUTDIR [--parts check,lora,nodes2,zero3,fault] [--runs 3]
--wheels DIR installs carried wheels to /tmp/site first; --cpu rehearses every part on CPU
(gloo, the tiny test model, the trainer venv): it checks this script, not the figures.
--summarize FILE... prints the tables of earlier results.jsonl files.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from gpu_observe import Observer  # noqa: E402  (bench/ is on sys.path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.procs import job_pids  # noqa: E402
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
W = "/tmp/gpu-proof"


class Setup:
    """What differs between the GPU proof and its CPU rehearsal."""

    def __init__(self, cpu: bool, per_device: int = 8):
        self.cpu = cpu
        # on CPU the trainer venv: MLAUNCH_TRAINER_VENV's (a venv outside the checkout), else ours
        venv = os.environ.get("MLAUNCH_TRAINER_VENV") or os.path.join(ROOT, ".venvs/trainer")
        self.python = os.path.join(venv, "bin", "python") if cpu else sys.executable
        self.bin = os.path.dirname(self.python)
        env = {**NO_MULTICAST, "DISABLE_VERSION_CHECK": "1", "HF_HUB_OFFLINE": "1",
               "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        self.env = {**env, "OMP_NUM_THREADS": "1"} if cpu else env
        self.per_device, self.cutoff = (2, 64) if cpu else (per_device, 1024)
        self.precision = "fp32" if cpu else "bf16"
        self.mbs = (4, 16) if cpu else (64, 4096)

    def model(self) -> dict:
        """The model and dataset, built once per machine (nothing is downloaded)."""
        info = os.path.join(W, "m", "model.json")
        if not os.path.exists(info):
            builder = "tests/tinymodel.py" if self.cpu else "bench/gpu_model.py"
            out = subprocess.run([self.python, builder, os.path.join(W, "m")], cwd=ROOT,
                                 capture_output=True, text=True, check=True)
            text = out.stdout.strip()
            start = text.rfind("\n{") + 1 if not text.startswith("{") else 0
            with open(info, "w") as fh:   # the builder's JSON is the end of its output
                fh.write(text[start:])
        with open(info) as fh:
            return json.load(fh)


def spec(s: Setup, name: str, *, steps=None, epochs=None, finetuning=None, deepspeed=None,
         hosts=("localhost",), gpus=2, devices=None, save_steps=1000, **extra) -> str:
    """Write a job spec; only hosts, gpus_per_node and python differ from a CPU test's."""
    m = s.model()
    training = {"learning_rate": 1.0e-4, "logging_steps": 5, "save_steps": save_steps,
                "lr_scheduler": "constant", "gradient_checkpointing": False}
    training.update({"max_steps": steps} if steps else {"epochs": epochs, "warmup_ratio": 0.1,
                                                         "lr_scheduler": "cosine"})
    cluster = {"hosts": list(hosts), "gpus_per_node": gpus, "python": s.python, "env": s.env}
    if devices:
        cluster["cuda_visible_devices"] = devices
    job = {"name": name, "cluster": cluster, "trainer": "llamafactory", "model": m["model"],
           "template": m["template"], "dataset": m["dataset"], "dataset_dir": m["dataset_dir"],
           "cutoff_len": s.cutoff, "batch": {"per_device": s.per_device, "grad_accum": 1},
           "finetuning": finetuning or {"type": "lora", "lora_rank": 16, "lora_target": "all"},
           "precision": s.precision, "training": training, "output_dir": f"{W}/out-{name}",
           "preflight": {"min_free_gb": 1, "min_shm_mb": 64}, **extra}
    if deepspeed:
        job["deepspeed"] = deepspeed
    path = f"{W}/{name}.yaml"
    with open(path, "w") as fh:
        json.dump(job, fh, indent=1)   # JSON is YAML
    return path


def run(cmd: list[str], log: str, s: Setup, timeout: float = 540) -> tuple[int, float]:
    t0 = time.monotonic()
    with open(log, "w") as fh:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, **s.env}, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return rc, round(time.monotonic() - t0, 1)


def mlaunch(*args: str) -> list[str]:
    return [sys.executable, "-m", "launcher.cli", *args]


def train(s: Setup, out: str, part: str, kind: str, i: int, cmd: list[str], out_dir: str,
          global_batch: int, save: bool = True, trace: bool = False, **extra) -> dict:
    """One training run, observed; its record is appended to results.jsonl (save=False: the
    caller completes the record and writes it itself)."""
    shutil.rmtree(out_dir, ignore_errors=True)
    with Observer(s.cpu, out_dir) as obs:
        rc, wall = run(cmd, f"{out}/{part}-{kind}-{i}.log", s)
    res = {}
    if os.path.exists(f"{out_dir}/all_results.json"):
        res = json.load(open(f"{out_dir}/all_results.json"))
    rec = {"part": part, "kind": kind, "i": i, "rc": rc, "wall_s": wall,
           "samples_per_s": res.get("train_samples_per_second"),
           "steady_samples_per_s": obs.steady(global_batch), "peak_mib": obs.peak, **extra}
    if trace:   # nvidia-smi every 200 ms and when each logged step landed, both from the start
        rec.update(mem_trace=obs.trace, step_times=[(round(t - obs.t0, 2), n) for t, n in obs.steps])
    return record(out, rec) if save else rec


def record(out: str, rec: dict) -> dict:
    with open(f"{out}/results.jsonl", "a") as fh:
        fh.write(json.dumps(rec) + "\n")
    print(json.dumps(rec), flush=True)
    return rec


def by_hand(s: Setup, spec_path: str, name: str, nproc: int = 2) -> list[str]:
    """torchrun on the very YAML mlaunch renders for spec_path (same run, no launcher)."""
    dest = f"{W}/hand-{name}"
    shutil.rmtree(dest, ignore_errors=True)
    subprocess.run(mlaunch("render", spec_path, "--out", dest, "--run-id", "hand"), cwd=ROOT,
                   check=True, capture_output=True)
    return [os.path.join(s.bin, "torchrun"), "--nproc-per-node", str(nproc),
            "-m", "llamafactory.launcher", f"{dest}/llamafactory.yaml"]


def part_check(s: Setup, out: str, runs: int) -> None:
    for mb in s.mbs:
        spec(s, f"check{mb}", steps=10)  # the training job itself; collective_mb set below
        job = json.load(open(f"{W}/check{mb}.yaml"))
        job["preflight"]["collective_mb"] = mb
        json.dump(job, open(f"{W}/check{mb}.yaml", "w"))
    run(mlaunch("check", f"{W}/check{s.mbs[-1]}.yaml"), f"{out}/check-table.txt", s)
    for i in range(runs):
        for mb in s.mbs:
            got = subprocess.run(mlaunch("check", f"{W}/check{mb}.yaml", "--json"), cwd=ROOT,
                                 capture_output=True, text=True, env={**os.environ, **s.env})
            results = json.loads(got.stdout)["results"] if got.stdout.strip() else []
            rows = [r for r in results if r["check"] == "collective"]
            m = re.search(r"busbw ([\d.]+) GB/s", rows[0]["detail"]) if rows else None
            gpu = [r["status"] for r in results if r["check"] == "gpu"]
            record(out, {"part": "check", "kind": "mlaunch", "i": i, "mb": mb,
                         "busbw_gbps": float(m.group(1)) if m else None, "gpu_rows": gpu})
            run([os.path.join(s.bin, "torchrun"), "--nproc-per-node", "2",
                 "tests/scripts/collective.py", "--mb", str(mb), "--iters", "5"], f"{W}/h.txt", s)
            line = [ln for ln in open(f"{W}/h.txt") if ln.startswith("MLAUNCH-COLLECTIVE ")]
            bw = json.loads(line[0].split(" ", 1)[1])["busbw_gbps"] if line else None
            record(out, {"part": "check", "kind": "by-hand", "i": i, "mb": mb, "busbw_gbps": bw})


def part_lora(s: Setup, out: str, runs: int, steps: int) -> None:
    path = spec(s, "lora", steps=steps)
    hand = by_hand(s, path, "lora")
    for i in range(runs):
        train(s, out, "lora", "mlaunch", i, mlaunch("submit", path), f"{W}/out-lora", 2 * s.per_device)
        train(s, out, "lora", "by-hand", i, hand, f"{W}/out-lora", 2 * s.per_device)


def part_nodes2(s: Setup, out: str, runs: int, steps: int) -> None:
    one = spec(s, "lora", steps=steps)
    two = spec(s, "nodes2", steps=steps, hosts=("localhost", "localhost"), gpus=1,
               devices=[[0], [1]])
    for i in range(runs):
        train(s, out, "nodes2", "2x1", i, mlaunch("submit", two), f"{W}/out-nodes2", 2 * s.per_device)
        train(s, out, "nodes2", "1x2", i, mlaunch("submit", one), f"{W}/out-lora", 2 * s.per_device)


def part_zero3(s: Setup, out: str, epochs: float) -> None:
    path = spec(s, "zero3", epochs=epochs, finetuning={"type": "full"}, deepspeed={"stage": 3})
    rec = train(s, out, "zero3", "mlaunch", 0, mlaunch("submit", path), f"{W}/out-zero3", 2 * s.per_device)
    run_id = re.search(r"run (zero3-\S+):", open(f"{out}/zero3-mlaunch-0.log").read())
    if not run_id:
        return
    rendered = f"/tmp/mlaunch/.mlaunch/{run_id.group(1)}"
    shutil.copy(f"{rendered}/ds_config.json", f"{out}/zero3-ds_config.json")
    warm = [ln for ln in open(f"{rendered}/llamafactory.yaml") if "warmup" in ln]
    state = json.load(open(f"{W}/out-zero3/trainer_state.json")) if rec["rc"] == 0 else {}
    record(out, {"part": "zero3", "kind": "rendered", "warmup_lines": warm,
                 "global_step": state.get("global_step"), "max_steps": state.get("max_steps")})


def part_fault(s: Setup, out: str, steps: int) -> None:
    path = spec(s, "fault", steps=steps, save_steps=steps // 3, max_restarts=1, restart_backoff_s=2)
    first = f"{W}/out-fault/checkpoint-{steps // 3}/trainer_state.json"
    shutil.rmtree(f"{W}/out-fault", ignore_errors=True)   # before the watcher looks for `first`
    killed: list[int] = []
    t = threading.Thread(target=kill_rank_after, args=(first, killed), daemon=True)
    t.start()
    rec = train(s, out, "fault", "mlaunch", 0, mlaunch("submit", path), f"{W}/out-fault", 2 * s.per_device)
    state = json.load(open(f"{W}/out-fault/trainer_state.json")) if rec["rc"] == 0 else {}
    text = open(f"{out}/fault-mlaunch-0.log").read()
    time.sleep(2)
    apps = "" if s.cpu else subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
        capture_output=True, text=True).stdout.strip()
    used = "" if s.cpu else subprocess.run(
        ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader"],
        capture_output=True, text=True).stdout.strip()
    record(out, {"part": "fault", "kind": "after", "killed_pid": killed, "global_step": state.get("global_step"),
                 "resumed": re.findall(r"resuming from (\S+)", text), "attempts": re.findall(r"attempt \d: exit \d+.*", text),
                 "gpu_apps_after": apps, "gpu_used_after": used, "job_pids_left": sorted(job_pids("fault-"))})


def kill_rank_after(path: str, killed: list[int]) -> None:
    """SIGKILL local rank 1 of this proof's fault job once its first checkpoint is complete."""
    while not os.path.exists(path):
        time.sleep(0.05)
    for pid in sorted(job_pids("fault-")):
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if b"LOCAL_RANK=1" in env and b"llamafactory" in cmd:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            return


def install(wheels: list[str]) -> None:
    """Carried wheels into /tmp/site, once per machine; children find them via PYTHONPATH."""
    if not os.path.exists("/tmp/site/.done"):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--no-cache-dir", "--upgrade", "--target", "/tmp/site",
                        *sorted(w for d in wheels for w in glob.glob(f"{d}/*.whl"))], check=True)
        open("/tmp/site/.done", "w").close()
    os.environ["PYTHONPATH"] = os.pathsep.join(["/tmp/site", ROOT, os.environ.get("PYTHONPATH", "")])
    sys.path[:0] = ["/tmp/site"]


def machine_args(ap: argparse.ArgumentParser) -> None:
    """The options every GPU proof script takes: carried wheels, and the CPU rehearsal."""
    ap.add_argument("--wheels", nargs="+", help="folders of carried wheels")
    ap.add_argument("--cpu", action="store_true", help="rehearse on CPU (gloo, the trainer venv)")


def prepare(out: str, wheels: list[str] | None, cpu: bool, per_device: int = 8, work: str = W) -> Setup:
    """The machine for a proof script: OUTDIR and its work folder, the carried wheels installed,
    mlaunch importable by every child, multicast off, and the Setup of this machine."""
    os.makedirs(out, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    if wheels:
        install(wheels)
    os.environ.update(NO_MULTICAST)
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, ROOT)
    return Setup(cpu, per_device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?")
    ap.add_argument("--parts", default="check,lora,nodes2,zero3,fault")
    ap.add_argument("--runs", type=int, default=3, help="LoRA runs each way")
    ap.add_argument("--check-runs", type=int, default=3)
    ap.add_argument("--nodes2-runs", type=int, default=1)
    ap.add_argument("--lora-steps", type=int, default=150)
    ap.add_argument("--per-device", type=int, default=8, help="per-GPU batch of the LoRA jobs")
    machine_args(ap)
    ap.add_argument("--summarize", nargs="+")
    a = ap.parse_args()
    from gpu_proof_report import summarize   # bench/ is on sys.path (this file's folder)
    if a.summarize:
        return print(summarize(a.summarize))
    s = prepare(a.out, a.wheels, a.cpu, a.per_device)
    steps = 12 if a.cpu else a.lora_steps
    parts = {"check": lambda: part_check(s, a.out, a.check_runs),
             "lora": lambda: part_lora(s, a.out, a.runs, steps),
             "nodes2": lambda: part_nodes2(s, a.out, a.nodes2_runs, steps),
             "zero3": lambda: part_zero3(s, a.out, 0.5 if a.cpu else 0.25),
             "fault": lambda: part_fault(s, a.out, 12 if a.cpu else 60)}
    for name in a.parts.split(","):
        t0 = time.monotonic()
        parts[name]()
        print(f"part {name}: {time.monotonic() - t0:.0f}s", flush=True)
    print(summarize([f"{a.out}/results.jsonl"]))


if __name__ == "__main__":
    main()

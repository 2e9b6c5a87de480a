"""Launch overhead and a world of one (issue 11, section 8): the same one-process LoRA job,
same rendered YAML, four ways, alternating:

  mlaunch          `mlaunch submit` (fast preflight on; a world of one runs in-process)
  mlaunch-torchrun `mlaunch submit` with cluster.torchrun: always (the form before)
  torchrun         `torchrun --nproc-per-node 1 -m llamafactory.launcher job.yaml` by hand
  lf-cli           `llamafactory-cli train job.yaml` (as `python -m llamafactory.cli`)

Per run: wall time, command start -> first LLaMA-Factory log line ("first rank line"),
samples/s (all_results.json, and steady-state from trainer_log.jsonl), peak GPU memory
(nvidia-smi every 200 ms). Appends one JSON line per run to OUTDIR/results.jsonl and prints
medians and ratios against `torchrun` and `lf-cli`.

GPU (one H200; model and data built locally by bench/gpu_model.py, nothing downloaded):
    python3 bench/overhead_world1.py OUTDIR --wheels .whl [--runs 1] [--steps 150] [--per-device 8]
Calls into the same OUTDIR continue the rounds (and rotate which way goes first), so n = 3
can be three calls of --runs 1, each under the device's 10-minute limit. The issue's
samples/s and memory comparison was per-device 64 (global batch 64): --per-device 64 --steps 30.
CPU rehearsal (tiny test model, trainer venv; checks this script, not the figures):
    python3 bench/overhead_world1.py OUTDIR --cpu --runs 1
--summarize FILE... prints the tables of earlier results.jsonl files.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import time

import gpu_proof as gp   # bench/ is on sys.path (this file's folder)
from gpu_observe import Observer
from gpu_proof_report import load

KINDS = ("mlaunch", "mlaunch-torchrun", "torchrun", "lf-cli")
# The trainer's first own line: LLaMA-Factory's logger ("[INFO|2026-12-01 ...] llamafactory...").
FIRST = re.compile(r"\[(INFO|WARNING)\|[^\]]*\] llamafactory\.")
STARTED = re.compile(r"^\[mlaunch\] run \S+: \d+ nodes")   # preflight and checks done, nodes start


def commands(s: gp.Setup, steps: int) -> dict[str, list[str]]:
    """The four command lines, all on the YAML mlaunch renders for one spec."""
    port = free_port()   # not 29500: another job on a shared machine may hold it
    one = gp.spec(s, "w1", steps=steps, gpus=1)
    always = gp.spec(s, "w1t", steps=steps, gpus=1)
    for path, extra in ((one, {}), (always, {"torchrun": "always"})):
        job = json.load(open(path))
        job["cluster"].update(master_port=port, **extra)
        job["output_dir"] = f"{gp.W}/out-w1"
        json.dump(job, open(path, "w"), indent=1)
    hand = gp.by_hand(s, one, "w1", nproc=1)
    hand[1:1] = ["--master-port", str(port)]
    yaml_path = hand[-1]
    return {"mlaunch": gp.mlaunch("submit", one), "mlaunch-torchrun": gp.mlaunch("submit", always),
            "torchrun": hand, "lf-cli": [s.python, "-m", "llamafactory.cli", "train", yaml_path]}


def free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def timed_run(cmd: list[str], log: str, s: gp.Setup, timeout: float = 540) -> dict:
    """Exit code, wall s, s to the first trainer line and (mlaunch) s to the nodes' start."""
    env = {**os.environ, **s.env}
    if s.cpu or not os.environ.get("CUDA_VISIBLE_DEVICES"):
        env.setdefault("CUDA_VISIBLE_DEVICES", "0")   # llamafactory-cli: one device, in-process
    t0, first, started = time.monotonic(), None, None
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=gp.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env)
        for line in proc.stdout:
            if first is None and FIRST.search(line):
                first = time.monotonic() - t0
            if started is None and STARTED.search(line):
                started = time.monotonic() - t0
            fh.write(line)
            if time.monotonic() - t0 > timeout:
                proc.kill()
        rc = proc.wait()
    r2 = lambda x: round(x, 2) if x is not None else None   # noqa: E731
    return {"rc": rc, "wall_s": r2(time.monotonic() - t0), "first_line_s": r2(first),
            "nodes_started_s": r2(started)}


def one_run(s: gp.Setup, out: str, kind: str, i: int, cmd: list[str]) -> dict:
    out_dir = f"{gp.W}/out-w1"
    shutil.rmtree(out_dir, ignore_errors=True)
    with Observer(s.cpu, out_dir) as obs:
        t = timed_run(cmd, f"{out}/w1-{kind}-{i}.log", s)
    res = {}
    if os.path.exists(f"{out_dir}/all_results.json"):
        res = json.load(open(f"{out_dir}/all_results.json"))
    return gp.record(out, {"part": "world1", "kind": kind, "i": i, **t,
                           "samples_per_s": res.get("train_samples_per_second"),
                           "steady_samples_per_s": obs.steady(s.per_device), "peak_mib": obs.peak})


def med(recs: list[dict], kind: str, key: str):
    v = [r[key] for r in recs if r["kind"] == kind and r.get(key) is not None and r.get("rc") == 0]
    return statistics.median(v) if v else None


def table(files: list[str]) -> str:
    recs = [r for f in files for r in load([f]) if r.get("part") == "world1"]
    rows = ["| way | n ok | wall s | first line s | nodes started s | samples/s | steady samples/s | peak MiB |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for k in KINDS:
        n = sum(1 for r in recs if r["kind"] == k and r.get("rc") == 0)
        peaks = [max(r["peak_mib"].values()) for r in recs if r["kind"] == k and r.get("peak_mib")]
        rows.append(f"| {k} | {n} | {_f(med(recs, k, 'wall_s'))} | {_f(med(recs, k, 'first_line_s'))} | "
                    f"{_f(med(recs, k, 'nodes_started_s'))} | {_f(med(recs, k, 'samples_per_s'))} | {_f(med(recs, k, 'steady_samples_per_s'))} | "
                    f"{max(peaks) if peaks else '–'} |")
    for ref in ("torchrun", "lf-cli"):
        for k in ("mlaunch", "mlaunch-torchrun"):
            a, b = med(recs, k, "samples_per_s"), med(recs, ref, "samples_per_s")
            fa, fb = med(recs, k, "first_line_s"), med(recs, ref, "first_line_s")
            wa, wb = med(recs, k, "wall_s"), med(recs, ref, "wall_s")
            rows.append(f"\n{k} vs {ref}: samples/s ratio {_r(a, b)}, wall ratio {_r(wa, wb)}, "
                        f"first line {_d(fa, fb)} s later")
    return "\n".join(rows)


def _f(x) -> str:
    return "–" if x is None else f"{x:.2f}"


def _r(a, b) -> str:
    return f"{a / b:.3f}" if a and b else "n/a"


def _d(a, b) -> str:
    return f"{a - b:+.2f}" if a is not None and b is not None else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?")
    ap.add_argument("--runs", type=int, default=3, help="runs of each way (alternating)")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--per-device", type=int, default=8)
    ap.add_argument("--kinds", default=",".join(KINDS))
    gp.machine_args(ap)
    ap.add_argument("--summarize", nargs="+")
    a = ap.parse_args()
    if a.summarize:
        return print(table(a.summarize))
    s = gp.prepare(a.out, a.wheels, a.cpu, a.per_device)
    cmds = commands(s, 6 if a.cpu else a.steps)
    kinds = a.kinds.split(",")
    results = f"{a.out}/results.jsonl"
    # Rounds continue across calls into one OUTDIR (a device call is limited to 10 minutes).
    done = len([r for r in load([results]) if r.get("part") == "world1"]) if os.path.exists(results) else 0
    for i in range(done // len(kinds), done // len(kinds) + a.runs):
        # Each round starts with another way: none always pays for a cold page cache.
        for kind in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:
            one_run(s, a.out, kind, i, cmds[kind])
    print(table([results]))


if __name__ == "__main__":
    main()

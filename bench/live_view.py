"""The live per-node view with real figures (issue 18): a LLaMA-Factory LoRA run through
`mlaunch submit` in a pseudo-terminal, as a user would watch it. The status blocks mlaunch
drew are cut out of the raw terminal stream and saved, with the run's live.json and its
gpu_sample events.

Usage, from the repo root of a GPU machine (rehearse with --cpu):
    python3 bench/live_view.py OUTDIR [--steps 200] [--per-device 32] [--wheels DIR]
OUTDIR gets terminal.raw (every byte the terminal got), status-blocks.txt (each block drawn,
with its time), live.json, gpu_samples.jsonl and results.jsonl (one line: rc, samples seen).
"""
from __future__ import annotations

import argparse
import fcntl
import glob
import json
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_proof as gp  # noqa: E402

STATUS = re.compile(rb"\x1b\[2m(.*?)\x1b\[0m\r?\n")


def record_smi(path: str, seconds: float) -> None:
    """nvidia-smi's rows, exactly as the sampler asks for them, for `seconds` (test data)."""
    with open(path, "w") as f:
        subprocess.run(["timeout", str(seconds), "nvidia-smi", "--query-gpu=index,utilization.gpu,"
                        "memory.used,memory.total", "--format=csv,noheader,nounits", "-lms", "500"],
                       stdout=f, stderr=subprocess.DEVNULL)


def in_terminal(cmd: list[str], env: dict, cols: int = 160, rows: int = 40,
                on_training=None) -> tuple[int, list]:
    """Run cmd under a pty of cols x rows; (exit code, [(seconds, bytes)] as they arrived).
    on_training: called once when the first loss line arrives."""
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(gp.ROOT)
        os.execvpe(cmd[0], cmd, env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    t0, chunks = time.monotonic(), []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:   # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append((round(time.monotonic() - t0, 2), data))
        if on_training is not None and b"'loss'" in data:
            threading.Thread(target=on_training, daemon=True).start()
            on_training = None
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), chunks


def blocks(chunks: list) -> list[tuple[float, list[str]]]:
    """Each status block as drawn: its time and its lines."""
    out = []
    for t, data in chunks:
        lines = [m.decode("utf-8", "replace") for m in STATUS.findall(data)]
        if lines:
            out.append((t, lines))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--per-device", type=int, default=32)
    ap.add_argument("--wheels", nargs="+")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--record-smi", metavar="PATH", help="also record nvidia-smi rows for 30 s of training")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(gp.W, exist_ok=True)
    if a.wheels:
        gp.install(a.wheels)
    s = gp.Setup(a.cpu, a.per_device)
    steps = 30 if a.cpu else a.steps
    path = gp.spec(s, "live", steps=steps, gpus=1, health={"sample_every_s": 1.0})
    out_dir = json.load(open(path))["output_dir"]
    shutil.rmtree(out_dir, ignore_errors=True)
    env = {**os.environ, **s.env, "TERM": "xterm",
           "PYTHONPATH": os.pathsep.join([gp.ROOT, os.environ.get("PYTHONPATH", "")])}
    record = (lambda: record_smi(a.record_smi, 30)) if a.record_smi else None
    rc, chunks = in_terminal(gp.mlaunch("submit", path), env, on_training=record)
    with open(f"{a.out}/terminal.raw", "wb") as f:
        f.write(b"".join(data for _, data in chunks))
    drawn = blocks(chunks)
    with open(f"{a.out}/status-blocks.txt", "w") as f:
        for t, lines in drawn:
            f.write(f"--- t={t:.2f}s\n" + "\n".join(lines) + "\n")
    live = glob.glob(f"{out_dir}/logs/*/live.json")
    if live:
        shutil.copy(live[0], f"{a.out}/live.json")
    events = glob.glob(f"{out_dir}/logs/*/events.jsonl")
    samples = [line for line in open(events[0]) if '"gpu_sample"' in line] if events else []
    with open(f"{a.out}/gpu_samples.jsonl", "w") as f:
        f.writelines(samples)
    gpu_lines = [line for _, lines in drawn for line in lines if re.search(r"gpu\d+\s+\d+%", line)]
    gp.record(a.out, {"part": "live-view", "rc": rc, "blocks": len(drawn),
                      "gpu_status_lines": len(gpu_lines), "last": drawn[-1][1] if drawn else None,
                      "gpu_sample_events": len(samples)})


if __name__ == "__main__":
    main()

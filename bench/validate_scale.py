"""How validation scales with the number of hosts: `mlaunch validate` on 1k and 10k-host hostfiles.

Usage: python bench/validate_scale.py [--sizes 1000,10000] [--runs N]

For each size it writes a hostfile (`node<i> slots=4`, and one with mixed slots and
OpenMPI's max_slots) under a LLaMA-Factory spec, then reports the median in-process
load_spec time, the time per host, the ratio to the smallest size (linear: ratio ≈ size
ratio), and the wall time of `mlaunch validate` as a subprocess. Then the duplicate-host
scan against the one it replaced (`keys.count(k)` per host, quadratic), in the same run.
Last, a hostfile of 10,000 bad lines: how many lines of errors mlaunch prints (capped).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from launcher.spec import load_spec  # noqa: E402
from launcher.spec.rules import _check_shared_hosts  # noqa: E402


def quadratic_scan(hosts: list[str]) -> list[str]:
    """The duplicate scan before issue 11: list.count per host."""
    keys = [h.lower() for h in hosts]
    return sorted({k for k in keys if keys.count(k) > 1})


def timed(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def write_case(tmp: str, n: int, mixed: bool) -> str:
    """A seed000 spec whose cluster is a hostfile of n hosts; the spec's path."""
    with open(os.path.join(ROOT, "configs", "seed000-qwen2-7b-lora.yaml")) as fh:
        data = yaml.safe_load(fh)
    tag = f"{n}{'m' if mixed else ''}"
    lines = [f"node{i} slots={(1 + i % 2) if mixed else 4}" + (" max_slots=8" if mixed else "")
             for i in range(n)]
    with open(os.path.join(tmp, f"hosts{tag}"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    c = data["cluster"]
    for k in ("hosts", "gpus_per_node", "master_addr"):
        c.pop(k, None)
    c["hostfile"] = f"hosts{tag}"
    data["batch"].pop("global", None)
    path = os.path.join(tmp, f"job{tag}.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh)
    return path


def in_process(path: str, runs: int) -> float:
    load_spec(path)  # warm imports and the page cache
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        load_spec(path)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cli(argv: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "PYTHONPATH": ROOT}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "launcher.cli", *argv], env=env,
                          capture_output=True, text=True)
    return time.perf_counter() - t0, done


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for mixed in (False, True):
            base = None
            for n in sizes:
                path = write_case(tmp, n, mixed)
                t = in_process(path, args.runs)
                base = base or (n, t)
                wall, done = cli(["validate", path])
                assert done.returncode == 0, done.stderr
                kind = "mixed slots + max_slots" if mixed else "slots=4"
                print(f"{n:>6} hosts ({kind:23s}): load_spec {t * 1e3:7.1f} ms "
                      f"({t / n * 1e6:5.1f} µs/host, ×{t / base[1]:.1f} for ×{n / base[0]:g} hosts); "
                      f"mlaunch validate {wall:.2f} s")
        for n in sizes:
            job = load_spec(write_case(tmp, n, False))
            new = timed(lambda: _check_shared_hosts(job.cluster, False), args.runs)
            old = timed(lambda: quadratic_scan(job.cluster.hosts), 1 if n > 2000 else args.runs)
            print(f"{n:>6} hosts: duplicate-host scan {new * 1e3:.1f} ms; the quadratic one it "
                  f"replaced {old * 1e3:.1f} ms (×{old / new:.0f})")
        bad = os.path.join(tmp, "bad")
        with open(bad, "w") as fh:
            fh.write("".join(f"node{i} slots=x\n" for i in range(10000)))
        with open(os.path.join(tmp, "jobbad.yaml"), "w") as fh:
            fh.write("name: bad\ncluster: {hostfile: bad}\ntrainer: script\nscript: {path: /t.py}\n")
        wall, done = cli(["validate", os.path.join(tmp, "jobbad.yaml")])
        print(f"10000 bad hostfile lines: exit {done.returncode}, {len(done.stderr.splitlines())} "
              f"lines printed in {wall:.2f} s; last: {done.stderr.splitlines()[-1]}")


if __name__ == "__main__":
    main()

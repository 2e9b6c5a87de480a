"""Ray backend start-up and stop against the SSH backend, on the same namespace hosts (needs
root, sshd and ray; tests/hostkit/raycluster.py).

  python bench/ray.py [--runs 5]

The same 3 nodes x 1 process job (tests/scripts/fail_or_sleep.py: every rank prints
`ready rank R`, then sleeps) two ways, alternating, on one 3-host set that runs both an sshd
and a Ray node per host (the Ray cluster is up before the first run and stays up):
  ray  `mlaunch submit -d` of a scheduler: ray spec (Ray Client address), then `mlaunch stop`
  ssh  `mlaunch submit -d` of the same job over SSH, then `mlaunch stop`
Figures: submit -> the first rank line in a node log on this machine, submit -> every rank's
line, and stop -> the last process of the run gone from every host (found by the run's
MLAUNCH_RUN_ID in its environment, per host namespace). Medians with min-max, one session.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.helpers import free_port, script_job, write_spec  # noqa: E402
from tests.hostkit.raycluster import make_ray  # noqa: E402
from tests.hosts import make_hosts  # noqa: E402
from tests.raynodes import ray_script_job  # noqa: E402

CLI = [sys.executable, "-m", "launcher.cli"]
READY = re.compile(rb"ready rank \d")
NODES = 3


def tagged(hosts, run_id: str) -> int:
    """Processes of the run on every host (its tag in their environment)."""
    mine, n = f"MLAUNCH_RUN_ID={run_id}".encode(), 0
    for h in hosts:
        for pid in h.pids():
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    n += mine in fh.read().split(b"\0")
            except OSError:
                pass
    return n


def wait(cond, timeout: float = 300, poll: float = 0.02) -> float:
    deadline = time.perf_counter() + timeout
    while not cond():
        if time.perf_counter() > deadline:
            raise RuntimeError("timed out")
        time.sleep(poll)
    return time.perf_counter()


def ready_lines(pattern: str) -> int:
    n = 0
    for path in glob.glob(pattern):
        with open(path, "rb") as fh:
            n += len(READY.findall(fh.read()))
    return n


def once(hosts, spec: dict, work: str) -> tuple[float, float, float]:
    env = {**os.environ, "MLAUNCH_HOME": os.path.join(work, "home")}
    path = write_spec(work, spec)
    t0 = time.perf_counter()
    r = subprocess.run([*CLI, "submit", "-d", path, "--no-preflight"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = re.search(r"run (\S+) detached", r.stdout).group(1)
    logs = os.path.join(spec["output_dir"], "logs", run_id, "node*.log")
    first = wait(lambda: ready_lines(logs) >= 1) - t0
    every = wait(lambda: ready_lines(logs) >= NODES) - t0
    t1 = time.perf_counter()
    s = subprocess.run([*CLI, "stop", run_id], cwd=ROOT, env=env, capture_output=True, text=True)
    assert s.returncode == 0, s.stdout + s.stderr
    gone = wait(lambda: tagged(hosts, run_id) == 0, poll=0.05) - t1
    return first, every, gone


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-ray-")
    results: dict[str, list[tuple[float, float, float]]] = {"ray": [], "ssh": []}
    with make_hosts(NODES) as hs, make_ray(hs, cpus=2) as cluster:
        for i in range(args.runs):   # alternating, so that load drifts hit both ways alike
            base = os.path.join(work, f"r{i}")
            os.makedirs(base)
            ray = ray_script_job(cluster, _Tmp(base, "ray"), "fail_or_sleep.py", ["-1", "0", "0"],
                                 nodes=NODES, nproc=1)
            results["ray"].append(once(hs.hosts, ray, base))
            ssh = script_job([h.ip for h in hs.hosts], 1, "fail_or_sleep.py", ["-1", "0", "0"],
                             f"{base}/ssh/out", hs=hs)
            ssh["cluster"]["master_port"] = free_port()
            results["ssh"].append(once(hs.hosts, ssh, base))
            print(f"run {i}: " + "  ".join(f"{k} {v[-1][0]:.2f}/{v[-1][1]:.2f}/{v[-1][2]:.2f}s"
                                           for k, v in results.items()), flush=True)
    print(f"\nmedians (min-max) over {args.runs} runs, {NODES} nodes x 1 process, --no-preflight:")
    cols = ("submit -> first rank line", "submit -> every rank", "stop -> last process gone")
    print(f"{'way':<4} " + " ".join(f"{c:>28}" for c in cols))
    med = {}
    for k, v in results.items():
        med[k] = [statistics.median(x[j] for x in v) for j in range(3)]
        spans = [f"{med[k][j]:.2f}s ({min(x[j] for x in v):.2f}-{max(x[j] for x in v):.2f})" for j in range(3)]
        print(f"{k:<4} " + " ".join(f"{s:>28}" for s in spans))
    print("ratios ray/ssh: " + ", ".join(f"{c} {med['ray'][j] / med['ssh'][j]:.2f}"
                                         for j, c in enumerate(cols)))


class _Tmp(str):
    """A path that `tmp_path / "out"` joins, as ray_script_job expects of pytest's tmp_path."""

    def __new__(cls, base: str, sub: str):
        return super().__new__(cls, os.path.join(base, sub))

    def __truediv__(self, other: str) -> str:
        return os.path.join(self, other)


if __name__ == "__main__":
    main()

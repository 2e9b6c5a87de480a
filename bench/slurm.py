"""Slurm backend latency on the test cluster (needs root, Slurm and sshd; tests/hostkit/slurm.py).

  python bench/slurm.py [--runs 5]

The same 2 nodes x 2 processes job (tests/scripts/fail_or_sleep.py: every rank prints
`ready rank R`, then sleeps) three ways on the same namespace hosts:
  slurm  `mlaunch submit -d` of a scheduler: slurm spec, then `mlaunch stop`
  ssh    `mlaunch submit -d` of the same job over SSH, then `mlaunch stop`
  hand   a hand-written sbatch script (srun of torchrun), then `scancel`
Figures: submit -> the first rank line in a log file on this machine, and stop (or
scancel) -> the last job process gone from every node namespace. Medians, one session.
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

from tests.helpers import SCRIPTS, free_port, script_job, write_spec  # noqa: E402
from tests.hostkit.slurm import make_slurm  # noqa: E402
from tests.hosts import make_hosts  # noqa: E402

CLI = [sys.executable, "-m", "launcher.cli"]
READY = re.compile(rb"ready rank \d")
JOB = os.path.join(SCRIPTS, "fail_or_sleep.py")


def left(hosts, keep) -> int:
    return sum(len(set(h.pids()) - k) for h, k in zip(hosts, keep))


def wait(cond, timeout: float = 120, poll: float = 0.02) -> float:
    deadline = time.perf_counter() + timeout
    while not cond():
        if time.perf_counter() > deadline:
            raise RuntimeError("timed out")
        time.sleep(poll)
    return time.perf_counter()


def has_ready(pattern: str) -> bool:
    for path in glob.glob(pattern):
        with open(path, "rb") as fh:
            if READY.search(fh.read()):
                return True
    return False


def mlaunch_once(cluster, spec: dict, work: str, keep) -> tuple[float, float]:
    env = {**os.environ, "SLURM_CONF": cluster.conf, "MLAUNCH_HOME": os.path.join(work, "home")}
    path = write_spec(work, spec)
    t0 = time.perf_counter()
    r = subprocess.run([*CLI, "submit", "-d", path, "--no-preflight"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = re.search(r"run (\S+) detached", r.stdout).group(1)
    logs = os.path.join(spec["output_dir"], "logs", run_id, "node*.log")
    first = wait(lambda: has_ready(logs)) - t0
    wait(lambda: left(cluster.hs.hosts, keep) >= 6, poll=0.05)   # every rank is up
    t1 = time.perf_counter()
    s = subprocess.run([*CLI, "stop", run_id], cwd=ROOT, env=env, capture_output=True, text=True)
    assert s.returncode == 0, s.stdout + s.stderr
    gone = wait(lambda: left(cluster.hs.hosts, keep) == 0) - t1
    return first, gone


def hand_once(cluster, work: str, port: int, keep) -> tuple[float, float]:
    out = tempfile.mkdtemp(dir=work)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    script = os.path.join(out, "hand.sbatch")
    with open(script, "w") as fh:
        fh.write(f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --output={out}/batch.log
master=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER=$(getent ahostsv4 "$master" | awk 'NR == 1 {{print $1}}')
srun --kill-on-bad-exit=1 --output={out}/node%n.log sh -c 'exec {torchrun} --nnodes 2 \\
  --nproc-per-node 2 --node-rank $SLURM_NODEID --master-addr $MASTER --master-port {port} \\
  --tee 3 {JOB} -1 0 0'
""")
    t0 = time.perf_counter()
    job = cluster.run(["sbatch", "--parsable", script]).stdout.strip()
    first = wait(lambda: has_ready(f"{out}/node*.log")) - t0
    wait(lambda: left(cluster.hs.hosts, keep) >= 6, poll=0.05)
    t1 = time.perf_counter()
    cluster.run(["scancel", job])
    gone = wait(lambda: left(cluster.hs.hosts, keep) == 0) - t1
    return first, gone


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-slurm-")
    results: dict[str, list[tuple[float, float]]] = {"slurm": [], "ssh": [], "hand": []}
    with make_hosts(2) as hs, make_slurm(hs) as cluster:
        keep = [set(h.pids()) for h in hs.hosts]   # sshd, slurmd: never the job's
        for i in range(args.runs):   # alternating, so that load drifts hit every way alike
            base = os.path.join(work, f"r{i}")
            os.makedirs(base)
            slurm = script_job([], 2, "fail_or_sleep.py", ["-1", "0", "0"], f"{base}/slurm-out")
            slurm["cluster"] = {"scheduler": "slurm", "slurm": {"nodes": 2}, "gpus_per_node": 2,
                                "python": sys.executable, "master_port": free_port(),
                                "shared_dir": f"{base}/shared"}
            results["slurm"].append(mlaunch_once(cluster, slurm, base, keep))
            ssh = script_job([h.ip for h in hs.hosts], 2, "fail_or_sleep.py", ["-1", "0", "0"],
                             f"{base}/ssh-out", hs=hs)
            results["ssh"].append(mlaunch_once(cluster, ssh, base, keep))
            results["hand"].append(hand_once(cluster, base, free_port(), keep))
            print(f"run {i}: " + "  ".join(f"{k} {v[-1][0]:.2f}/{v[-1][1]:.2f}s"
                                           for k, v in results.items()), flush=True)
    med = {k: (statistics.median(a for a, _ in v), statistics.median(b for _, b in v))
           for k, v in results.items()}
    print(f"\nmedians over {args.runs} runs (2 nodes x 2 processes):")
    print(f"{'way':<6} {'submit -> first rank line':>26} {'stop -> last process gone':>26}")
    for k, (a, b) in med.items():
        print(f"{k:<6} {a:>25.2f}s {b:>25.2f}s")
    print(f"ratios: slurm/hand {med['slurm'][0] / med['hand'][0]:.2f} (first line), "
          f"{med['slurm'][1] / med['hand'][1]:.2f} (stop); slurm/ssh {med['slurm'][0] / med['ssh'][0]:.2f}, "
          f"{med['slurm'][1] / med['ssh'][1]:.2f}")


if __name__ == "__main__":
    main()

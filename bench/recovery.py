"""Time back to training after a hard kill, on the namespace test hosts (root, sshd; see
tests/hosts.py): a 4-node script job over gloo (bench/recover_job.py, a step every 0.5 s);
once every node has stepped, node 3 is broken (--faults): `kill`, SIGKILL to every process of
it and its sshd; `freeze`, SIGSTOP to every process of it (its sshd, its init: a hung machine
whose TCP stack still answers). From the fault to the first step of the new world (rank 0's
wall stamp on it):

  spare    mlaunch with a spare host (cluster.spare_hosts), max_restarts 1
  shrink   mlaunch without one, cluster.min_nodes 3: the job goes on with 3 nodes
  elastic  torchrun's own elastic restart by hand: pdsh starts `torchrun --nnodes 3:5
           --max-restarts 3 --rdzv-backend c10d` on the 4 hosts (with
           TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: PyTorch #135712)

The cases (mode x fault x tree) alternate, --runs each; medians with the range. For mlaunch,
the phases of the restart as its events.jsonl records them (launcher/record/phases.py), and
the same run's fresh start: from `mlaunch submit` to its first step (the yardstick of "back to
training no later than a fresh submit's first step + 5 s"). torchrun elastic under a freeze is
given 120 s (gloo's own timeout is 30 min): "no recovery" then.

  python bench/recovery.py --runs 3 [--modes spare,shrink,elastic] [--faults kill,freeze] [--tree /work/main]

--tree: the launcher source the `mlaunch` runs import (PYTHONPATH): an older tree measures
"before" in the same session.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from launcher.record import phases  # noqa: E402
from launcher.record.events import read_events  # noqa: E402
from tests.helpers import free_port, script_job, write_spec  # noqa: E402
from tests.hosts import make_hosts  # noqa: E402

JOB = os.path.join(ROOT, "bench", "recover_job.py")
READY = re.compile(r"ready rank (\d+) pid (\d+)")
NEW_STEP = re.compile(r"(\{.*\"restarted\": true.*\})")
STEPS_AFTER = 6


def hard_kill(host) -> None:
    """SIGKILL to every process of the host, its sshd listener included, at once."""
    for pid in host.pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def mend(host, fault: str) -> None:
    """The host back as it was: thawed (whatever of the run it still held then ends: its
    sessions are gone, so its hang-up guard fires; anything left is killed) or its sshd restarted."""
    if fault == "freeze":
        host.thaw()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(host.pids() - {host.sshd_pid, host.init_pid}) > 0:
            time.sleep(0.1)
        for pid in host.pids() - {host.sshd_pid, host.init_pid}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    else:
        host.start_sshd()


def wait_ready(lines, n: int) -> float | None:
    """Until every node has stepped; rank 0's wall stamp on step 1 (None if not seen)."""
    seen, first = set(), None
    for line in lines:
        if first is None and (m := re.search(r"(\{\"step\": 1, .*\})", line)):
            first = json.loads(m.group(1))["wall"]
        if m := READY.search(line):
            seen.add(m.group(1))
        if len(seen) == n:
            return first
    raise RuntimeError("the job ended before every node stepped")


def wait_world(lines, world: int) -> None:
    """Until rank 0 has stepped 3 times in a world of `world` (an all-reduce: every rank has)."""
    for line in lines:
        m = re.search(r"(\{\"step\".*\})", line)
        if m:
            d = json.loads(m.group(1))
            if d["world"] == world and d["step"] >= 3:
                return
    raise RuntimeError(f"the job ended before a world of {world} stepped")


def first_new_step(text: str) -> float:
    m = NEW_STEP.search(text)
    if not m:
        raise RuntimeError("no step of the new world:\n" + text[-3000:])
    return json.loads(m.group(1))["wall"]


def mlaunch(hs, mode: str, fault: str, tmp: str, tree: str) -> tuple[float, dict]:
    a, b, c, d, e = hs.hosts
    out = os.path.join(tmp, f"out-{mode}-{time.time_ns()}")
    extra = {"spare_hosts": [e.ip]} if mode == "spare" else {"min_nodes": 3}
    spec = script_job([h.ip for h in (a, b, c, d)], 1, "steps.py", [str(STEPS_AFTER), out + ".marker"],
                      out, hs=hs, **extra) | {"max_restarts": 1, "name": f"recovery-{mode}"}
    spec["script"]["path"] = JOB
    env = {**os.environ, "PYTHONPATH": tree, "MLAUNCH_HOME": os.path.join(tmp, "home")}
    argv = [sys.executable, "-m", "launcher.cli", "submit", write_spec(tmp, spec)]
    t_launch = time.time()
    proc = subprocess.Popen(argv, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = wait_ready(proc.stdout, 4)
    t_kill = time.time()
    hard_kill(d) if fault == "kill" else d.freeze()   # SIGSTOP, its sshd and init too
    try:
        rest = proc.communicate(timeout=300)[0]
    finally:
        mend(d, fault)
    if proc.returncode != 0:
        raise RuntimeError(f"mlaunch {mode} exit {proc.returncode}:\n{rest[-3000:]}")
    back = first_new_step(rest) - t_kill
    found = glob.glob(f"{out}/logs/*/events.jsonl")
    timeline = phases.timeline(read_events(found[0])) if found else []
    parts = {p.name: p.seconds for p in timeline if p.attempt == 1 or p.name in ("teardown", "settle")}
    parts["(fresh submit to step 1)"] = first - t_launch if first else None
    return back, parts


def elastic(hs, fault: str, tmp: str) -> tuple[float, dict]:
    a, b, c, d, _ = hs.hosts
    port = free_port()
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = (f"env TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 {torchrun} --nnodes 3:5 --nproc-per-node 1 "
           f"--max-restarts 3 --rdzv-backend c10d --rdzv-endpoint {a.ip}:{port} "
           f"--rdzv-id bench{port} {JOB} {STEPS_AFTER} {os.path.join(tmp, f'elastic-{port}.marker')}")
    env = {**os.environ, "PDSH_RCMD_TYPE": "ssh",
           "PDSH_SSH_ARGS_APPEND": f"-i {hs.key_file} -o UserKnownHostsFile={hs.known_hosts} "
                                   "-o BatchMode=yes -o StrictHostKeyChecking=yes"}
    proc = subprocess.Popen(["pdsh", "-l", "root", "-w", ",".join(h.ip for h in (a, b, c, d)), cmd],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_world(proc.stdout, 4)   # a node that joined late makes torchrun form the world again
    t_kill = time.time()
    hard_kill(d) if fault == "kill" else d.freeze()   # SIGSTOP, its sshd and init too
    try:
        rest = proc.communicate(timeout=240 if fault == "kill" else 120)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        rest = proc.communicate()[0]
    mend(d, fault)
    for h in (a, b, c):   # anything torchrun left (a failed recovery)
        for pid in h.pids():
            if pid != h.sshd_pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    return first_new_step(rest) - t_kill, {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--modes", default="spare,shrink,elastic")
    ap.add_argument("--faults", default="kill", help="kill, freeze or both, comma-separated")
    ap.add_argument("--tree", default=ROOT, help="launcher source trees, comma-separated: alternated")
    args = ap.parse_args()
    modes = args.modes.split(",")
    if "elastic" in modes and not shutil.which("pdsh"):
        sys.exit("pdsh is not installed")
    trees = args.tree.split(",")
    faults = args.faults.split(",")
    cases = [(m, f, t) for m in modes for f in faults for t in (trees if m != "elastic" else [""])]
    got: dict[tuple, list[float]] = {c: [] for c in cases}
    fresh: dict[tuple, list[float]] = {c: [] for c in cases}
    print(f"launcher trees: {trees}; {args.runs} runs per case, alternating; faults {faults} of node 3 of 4")
    with tempfile.TemporaryDirectory() as tmp, make_hosts(5, isolated_home=True) as hs:
        for i in range(args.runs):
            for case in cases:
                mode, fault, tree = case
                try:
                    s, parts = elastic(hs, fault, tmp) if mode == "elastic" else mlaunch(hs, mode, fault, tmp, tree)
                except RuntimeError as e:
                    print(f"run {i} {mode} {fault} {tree}: FAILED (no recovery): {str(e)[:300]}", flush=True)
                    continue
                got[case].append(s)
                if parts.get("(fresh submit to step 1)") is not None:
                    fresh[case].append(parts["(fresh submit to step 1)"])
                shown = ", ".join(f"{k} {v:.2f}" for k, v in parts.items() if v is not None)
                print(f"run {i} {mode:8s} {fault:6s} {tree:10s} fault -> first step of the new world {s:6.2f} s"
                      + (f"   phases: {shown}" if shown else ""), flush=True)
    print()
    for case, xs in got.items():
        mode, fault, tree = case
        if not xs:
            print(f"{mode:8s} {fault:6s} {tree:10s} no run recovered")
            continue
        line = f"{mode:8s} {fault:6s} {tree:10s} median {statistics.median(xs):6.2f} s  range {min(xs):.2f}-{max(xs):.2f}  n={len(xs)}"
        if fresh[case]:
            f = statistics.median(fresh[case])
            line += f"; fresh submit to step 1 median {f:.2f} s: recovery - fresh {statistics.median(xs) - f:+.2f} s"
        print(line)


if __name__ == "__main__":
    main()

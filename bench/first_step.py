"""Time to first step on the namespace test hosts (root, sshd; see tests/hosts.py): a tiny
torchrun script job over gloo (bench/first_step_job.py), 1 process per host, from the moment
the launcher is started to rank 0's first step (an all-reduce: every rank has reached it):

  pdsh        torchrun by hand on every host at once: `pdsh -w ... torchrun ...` with the
              arguments mlaunch renders (--nnodes N --node-rank R --master-addr/--master-port,
              --max-restarts 0 --tee 3 --log-dir, PYTHONUNBUFFERED=1)
  mlaunch     `mlaunch submit` (preflight included)
  nopre       `mlaunch submit --no-preflight`
  cold        `mlaunch submit` with cluster.warm_start: false (torchrun starts only after the
              checks, as before the warm start)

The variants alternate, --runs each; medians with the range, ratios against pdsh. For
mlaunch, its phases (launcher/record/phases.py) too, as medians. Node-side CPU: every session
each host's sshd served in the run (its reaped children's CPU, after the sessions ended), per
host: mlaunch's minus pdsh's is what mlaunch costs a node beyond torchrun's own. Launcher-side CPU: what the command this script
started used, its children included (pdsh and its ssh clients; mlaunch, its ssh clients and
its local helpers), from start to exit.

--launcher-cores K keeps the launchers (pdsh or mlaunch, and the ssh clients they start) on the
first K cores and the hosts on the others, as on a cluster, where the launcher's machine is not
a node's; without it, launchers and hosts share every core.

  python bench/first_step.py --hosts 8 --runs 5 [--launcher-cores 2] [--tree /other/launcher/tree,...]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from launcher.record import phases  # noqa: E402
from launcher.record.events import read_events  # noqa: E402
from tests.helpers import free_port, script_job, write_spec  # noqa: E402
from tests.hosts import make_hosts  # noqa: E402
from bench.flood_cpu import reaped_cpu  # noqa: E402

JOB = os.path.join(ROOT, "bench", "first_step_job.py")
STEP1 = re.compile(r"(\{\"step\": 1, .*\})")


def first_step(text: str, t0: float) -> float:
    m = STEP1.search(text)
    if not m:
        raise RuntimeError("no first step:\n" + text[-3000:])
    return json.loads(m.group(1))["wall"] - t0


LAUNCHER_CORES: set[int] | None = None   # --launcher-cores: where each launcher runs (else anywhere)


def pinned() -> None:
    """preexec_fn of each launcher (pdsh or mlaunch): its process and every child it starts
    (ssh clients) on the launcher's cores, apart from the hosts'."""
    if LAUNCHER_CORES:
        os.sched_setaffinity(0, LAUNCHER_CORES)


def split_cores(hs, k: int) -> str:
    """The first k cores for the launchers, the rest for the hosts: each host's sshd (whose
    sessions, torchrun and ranks inherit it) pinned to them. As on a cluster, where the launcher
    runs on a machine of its own and no node's CPU time is taken by it."""
    global LAUNCHER_CORES
    cores = sorted(os.sched_getaffinity(0))
    if not 0 < k < len(cores):
        raise SystemExit(f"--launcher-cores {k}: this machine has {len(cores)} cores")
    LAUNCHER_CORES = set(cores[:k])
    for h in hs.hosts:
        os.sched_setaffinity(h.sshd_pid, set(cores[k:]))
    return f"launchers on cores {cores[:k]}, hosts on the other {len(cores) - k}"


def by_hand(hs, n: int, tmp: str) -> tuple[float, dict]:
    hosts = hs.hosts[:n]
    port = free_port()
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    ranks = " ".join(f"{h.name}) r={i};;" for i, h in enumerate(hosts))
    logs = os.path.join(tmp, f"byhand-{time.time_ns()}")
    cmd = (f"case $(hostname) in {ranks} esac; exec env PYTHONUNBUFFERED=1 {torchrun} --nnodes {n} "
           f"--nproc-per-node 1 --node-rank $r --master-addr {hosts[0].ip} --master-port {port} "
           f"--max-restarts 0 --tee 3 --log-dir {logs}/node$r {JOB} 3")
    env = {**os.environ, "PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS_APPEND":
           f"-i {hs.key_file} -o UserKnownHostsFile={hs.known_hosts} -o BatchMode=yes -o StrictHostKeyChecking=yes"}
    t0 = time.time()
    r = subprocess.run(["pdsh", "-f", str(max(32, n)), "-l", "root", "-w", ",".join(h.ip for h in hosts), cmd],
                       env=env, capture_output=True, text=True, timeout=240, preexec_fn=pinned)
    if r.returncode != 0:
        raise RuntimeError(f"pdsh exit {r.returncode}: {r.stdout[-2000:]} {r.stderr[-2000:]}")
    return first_step(r.stdout, t0), {}


def mlaunch(hs, n: int, tmp: str, tree: str, preflight: bool, warm: bool = True) -> tuple[float, dict]:
    out = os.path.join(tmp, f"out-{time.time_ns()}")
    spec = script_job([h.ip for h in hs.hosts[:n]], 1, "steps.py", ["3"], out, hs=hs) | {"name": "first-step"}
    if not warm:   # only then: a launcher tree older than the key refuses it
        spec["cluster"]["warm_start"] = False
    spec["script"]["path"] = JOB
    # The tree first, then PYTHONPATH's own entries: on the GPU machine those hold the carried
    # wheels the launcher imports (pydantic, paramiko: bench/device_kit.sh run's /tmp/site).
    path = [tree] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "MLAUNCH_HOME": os.path.join(tmp, "home")}
    argv = [sys.executable, "-m", "launcher.cli", "submit", write_spec(tmp, spec)] + ([] if preflight else ["--no-preflight"])
    t0 = time.time()
    r = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=240, preexec_fn=pinned)
    if r.returncode != 0:
        raise RuntimeError(f"mlaunch exit {r.returncode}: {r.stdout[-2000:]} {r.stderr[-2000:]}")
    found = glob.glob(f"{out}/logs/*/events.jsonl")
    parts = {}
    events = read_events(found[0]) if found else []
    for p in phases.timeline(events):
        if p.attempt == 0 and p.name not in ("training",):
            parts[p.name] = parts.get(p.name, 0.0) + p.seconds
    if (last := last_start(events)) is not None:
        parts["(last node started, s after the start phase began)"] = last
    if (began := first_mark(events)) is not None:
        parts["(launcher's own start: to its connect mark)"] = began - t0
    return first_step(r.stdout, t0), parts


def first_mark(events: list[dict]) -> float | None:
    """When the run's first phase began (its connect mark), as a time.time() figure."""
    from datetime import datetime
    at = [datetime.fromisoformat(e["time"]).timestamp() for e in events if e.get("event") == "phase"]
    return min(at) if at else None


def last_start(events: list[dict]) -> float | None:
    """When the last node's script was sent (its node_start), after the start phase began."""
    from datetime import datetime
    at = [e["time"] for e in events if e.get("event") == "phase" and e.get("phase") == "start"]
    starts = [e["time"] for e in events if e.get("event") == "node_start" and e.get("attempt", 0) == 0]
    if not at or not starts:
        return None
    return (datetime.fromisoformat(max(starts)) - datetime.fromisoformat(at[0])).total_seconds()


def launcher_cpu() -> float:
    """CPU seconds of this script's reaped children: the launcher of each run, its children
    included, once it has exited."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tree", default=ROOT, help="launcher source trees, comma-separated: alternated")
    ap.add_argument("--variants", default="pdsh,mlaunch,nopre,cold", help="which of pdsh, mlaunch, nopre, cold")
    ap.add_argument("--launcher-cores", type=int, default=0,
                    help="run the launchers on this many cores and the hosts on the others (0: all share every core)")
    args = ap.parse_args()
    trees = args.tree.split(",")
    for tree in trees:   # byte-compiled, as pip installs it (a stale cache recompiles ~0.1 s per run)
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(tree, "launcher")],
                       check=True, stdout=subprocess.DEVNULL)
    wanted = args.variants.split(",")
    cases = [("pdsh", "")] * ("pdsh" in wanted) + [(v, t) for t in trees for v in ("mlaunch", "nopre", "cold") if v in wanted]
    got: dict[tuple, list[float]] = defaultdict(list)
    parts: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    print(f"{args.hosts} hosts, 1 process each; {args.runs} runs per variant, alternating; trees {trees}")
    with tempfile.TemporaryDirectory() as tmp, make_hosts(args.hosts, isolated_home=True) as hs:
        if args.launcher_cores:
            print(split_cores(hs, args.launcher_cores), flush=True)
        for i in range(args.runs):
            for case in cases:
                v, tree = case
                sshds = [h.sshd_pid for h in hs.hosts[:args.hosts]]
                c0, l0 = reaped_cpu(sshds), launcher_cpu()
                try:
                    s, ph = by_hand(hs, args.hosts, tmp) if v == "pdsh" else \
                        mlaunch(hs, args.hosts, tmp, tree, v != "nopre", warm=v != "cold")
                    ph["(launcher-side CPU s)"] = launcher_cpu() - l0
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    print(f"run {i} {v} {tree}: FAILED {str(e)[:300]}", flush=True)
                    continue
                deadline = time.monotonic() + 30   # every session reaped by its sshd
                while time.monotonic() < deadline and any(len(h.pids()) > 1 for h in hs.hosts[:args.hosts]):
                    time.sleep(0.05)
                ph["(node CPU s per host)"] = (reaped_cpu(sshds) - c0) / args.hosts
                got[case].append(s)
                for k, x in ph.items():
                    parts[case][k].append(x)
                print(f"run {i} {v:8s} {tree:12s} {s:6.2f} s   node CPU per host "
                      f"{ph['(node CPU s per host)']:.3f} s   launcher-side CPU "
                      f"{ph['(launcher-side CPU s)']:.3f} s", flush=True)
    base = statistics.median(got[("pdsh", "")]) if got[("pdsh", "")] else None
    print()
    for case in cases:
        xs = got[case]
        if not xs:
            print(f"{case[0]:8s} {case[1]:12s} no run")
            continue
        m = statistics.median(xs)
        ratio = f"  {m / base:.2f}x pdsh" if base else ""
        print(f"{case[0]:8s} {case[1]:12s} median {m:6.2f} s  range {min(xs):.2f}-{max(xs):.2f}  n={len(xs)}{ratio}")
        if parts[case]:
            print("    phases (median s): " + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in parts[case].items()))


if __name__ == "__main__":
    main()

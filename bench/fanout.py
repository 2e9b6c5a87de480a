"""Fan-out benchmarks on the namespace test hosts (needs root and sshd; see tests/hosts.py).

  python bench/fanout.py start      # start `true` on 1..16 hosts: mlaunch vs ssh loop vs pdsh
  python bench/fanout.py teardown   # failing rank's exit -> last job process gone, 2 and 8 hosts
  python bench/fanout.py logs       # 8 hosts x 20 MB of numbered lines: integrity and throughput
                                    # (--hosts 64 --mb 5: the 64-host flood)
  python bench/fanout.py rate       # a rank's own write rate: launcher running/throttled/stopped/killed

Figures are medians of several runs measured in one session; ratios are what to compare.
"""
from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from launcher.session.attempt import run_job  # noqa: E402
from launcher.transport.ssh import SSHExecutor  # noqa: E402
from launcher.logs.stream import Printer  # noqa: E402
from launcher.plan.launch_plan import build_plan  # noqa: E402
from launcher.spec import SSH, validate  # noqa: E402
from tests.helpers import script_job  # noqa: E402
from tests.hosts import make_hosts  # noqa: E402


def ssh_settings(hs) -> SSH:
    return SSH(user="root", key_file=hs.key_file, known_hosts=hs.known_hosts)


def mlaunch_start(hs, ips: list[str]) -> float:
    """Connect to every host and run `true` on each, in parallel, through the SSH executor."""
    t0 = time.perf_counter()
    ex = SSHExecutor(ips, ssh_settings(hs))
    assert not ex.connect()
    with ThreadPoolExecutor(max_workers=len(ips)) as pool:
        codes = list(pool.map(lambda h: ex.run(h, "true", 30)[0], ips))
    ex.close()
    assert codes == [0] * len(ips), codes
    return time.perf_counter() - t0


def ssh_loop(hs, ips: list[str]) -> float:
    t0 = time.perf_counter()
    for host in hs.hosts[:len(ips)]:
        subprocess.run(hs.ssh_argv(host) + ["true"], check=True)
    return time.perf_counter() - t0


def pdsh(hs, ips: list[str]) -> float:
    env = {**os.environ, "PDSH_RCMD_TYPE": "ssh",
           "PDSH_SSH_ARGS_APPEND": f"-i {hs.key_file} -o UserKnownHostsFile={hs.known_hosts} "
                                   "-o BatchMode=yes -o StrictHostKeyChecking=yes"}
    t0 = time.perf_counter()
    subprocess.run(["pdsh", "-l", "root", "-w", ",".join(ips), "true"], check=True, env=env)
    return time.perf_counter() - t0


def bench_start(runs: int, isolated_home: bool) -> None:
    have_pdsh = shutil.which("pdsh") is not None
    # isolated_home: a clean root home per host, so ~/.bashrc (pyenv init: ~0.3 s of wall
    # time per login here) does not drown the launcher's own cost.
    with make_hosts(16, isolated_home=isolated_home) as hs:
        ips = [h.ip for h in hs.hosts]
        base = None
        print(f"{'hosts':>5} {'mlaunch':>9} {'ssh loop':>9} {'pdsh':>9}  mlaunch/1-host  mlaunch/pdsh")
        for n in (1, 2, 4, 8, 16):
            sub = ips[:n]
            m = statistics.median(mlaunch_start(hs, sub) for _ in range(runs))
            s = statistics.median(ssh_loop(hs, sub) for _ in range(runs))
            p = statistics.median(pdsh(hs, sub) for _ in range(runs)) if have_pdsh else float("nan")
            base = base or m
            print(f"{n:>5} {m:>8.3f}s {s:>8.3f}s {p:>8.3f}s  {m / base:>13.2f}x  {m / p:>11.2f}x")


def last_job_process_gone(run_id: str, timeout: float) -> float:
    """Poll /proc (the namespaces share one PID space) until no process carries run_id."""
    needle = f"MLAUNCH_RUN_ID={run_id}".encode()
    deadline = time.time() + timeout
    seen = False
    while time.time() < deadline:
        alive = False
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/environ", "rb") as fh:
                        if needle in fh.read().split(b"\0"):
                            alive = seen = True
                            break
                except OSError:
                    pass
        if seen and not alive:
            return time.time()
        time.sleep(0.01)
    raise TimeoutError("job processes still alive")


def teardown_once(hs, tmp: str, n: int) -> float:
    stamp = os.path.join(tmp, "exit-stamp")
    spec = script_job([h.ip for h in hs.hosts[:n]], 1, "fail_or_sleep.py", [str(n - 1), "3", "2"],
                      os.path.join(tmp, "out"), hs=hs)
    spec["cluster"]["env"] = {"EXIT_STAMP": stamp}
    spec["script"]["path"] = os.path.join(ROOT, "bench", "stamp_exit.py")
    plan = build_plan(validate(spec))
    with ThreadPoolExecutor(1) as pool:
        gone = pool.submit(last_job_process_gone, plan.run_id, 120)
        result = run_job(plan, SSHExecutor([nd.login for nd in plan.nodes], ssh_settings(hs)),
                         Printer(plan.mask, io.StringIO()))
        assert result.code == 3, result
        end = gone.result()
    with open(stamp) as fh:
        return end - float(fh.read())


def bench_teardown(runs: int) -> None:
    for n in (2, 8):
        with make_hosts(n) as hs, tempfile.TemporaryDirectory() as tmp:
            t = [teardown_once(hs, tmp, n) for _ in range(runs)]
            print(f"{n} hosts: failing rank exit -> last process gone: median {statistics.median(t):.2f}s "
                  f"(min {min(t):.2f}, max {max(t):.2f}, n={runs})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["start", "teardown", "logs", "rate"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mb", type=int, default=20)
    ap.add_argument("--hosts", type=int, default=8, help="logs: namespace hosts flooding at once")
    ap.add_argument("--payload", choices=["x", "hex"], default="x",
                    help="logs: 'x' packs 35x under zlib, 'hex' about 2x (bench/logflood.py)")
    ap.add_argument("--unpaced", action="store_true",
                    help="logs: also mlaunch without the console's pace (logs/console.py), same runs")
    ap.add_argument("--real-home", action="store_true", help="log in with root's real ~/.bashrc")
    args = ap.parse_args()
    if args.what == "start":
        bench_start(args.runs, not args.real_home)
    elif args.what == "teardown":
        bench_teardown(args.runs)
    elif args.what == "rate":
        import json
        from bench.logflood import bench_rank_rate
        print(json.dumps({"local": bench_rank_rate()}), flush=True)
        from tests.hosts import make_hosts
        with make_hosts(1, isolated_home=True) as hs:   # over SSH: the node log spliced
            print(json.dumps({"ssh": bench_rank_rate(hs=hs)}))
    else:
        from bench.logflood import bench_logs
        bench_logs(args.runs, args.mb, args.hosts, hex_payload=args.payload == "hex",
                   with_unpaced=args.unpaced)


if __name__ == "__main__":
    main()

"""Preflight benchmark on the namespace test hosts (needs root and sshd; see tests/hosts.py).

  python bench/preflight.py                 # full `check` (fast checks + all-reduce), 2 and 8 hosts
  python bench/preflight.py --fast          # the fast checks only (what `submit` runs first)
  python bench/preflight.py --real-home     # sessions run root's ~/.bashrc (pyenv init, ~0.3 s each)
  python bench/preflight.py --node-cpu      # the fast checks' CPU on the nodes, per host

--node-cpu: each run connects twice, once only to close again and once to run the fast
checks; each host's sshd's reaped CPU (every session it served, bench/flood_cpu.py) after
the sessions ended, per host; the checks' cost is the second minus the first.

Each figure is the median of --runs runs of check_command (the function behind
`mlaunch check`: load the spec, connect, probe, all-reduce of --mb MB with one process per
host) on one HostSet. No assertions: this measures, the tests judge.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from launcher.backends import backend_of  # noqa: E402
from launcher.plan.launch_plan import build_plan  # noqa: E402
from launcher.cli.check_cmd import check_command  # noqa: E402
from launcher.preflight.runner import run_checks  # noqa: E402
from launcher.spec import validate  # noqa: E402
from tests.helpers import script_job, write_spec  # noqa: E402
from tests.hosts import make_hosts  # noqa: E402
from bench.flood_cpu import reaped_cpu  # noqa: E402


def spec_for(hs, tmp: str, n: int, mb: int) -> dict:
    """A healthy script job over the first n hosts, with limits this machine meets."""
    shared = os.path.join(tmp, "shared")
    os.makedirs(shared, exist_ok=True)
    spec = script_job([h.ip for h in hs.hosts[:n]], 1, "allreduce.py", [], os.path.join(tmp, "out"),
                      hs=hs, env={"GLOO_SOCKET_IFNAME": "eth0"}, shared_dir=shared)
    spec["preflight"] = {"min_free_gb": 0.5, "min_shm_mb": 16, "collective_mb": mb,
                         "collective_timeout_s": 120}
    return spec


def full_check(spec: dict, tmp: str) -> float:
    """Wall time of check_command on spec (its table is swallowed; a failure is reported)."""
    path = write_spec(tmp, spec)
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        rc = check_command(path, as_json=False)
    took = time.perf_counter() - t0
    if rc != 0:
        print(out.getvalue())
    return took


def fast_check(spec: dict) -> float:
    """Wall time of the fast checks on an already-connected executor (as submit runs them)."""
    plan = build_plan(validate(spec))
    ex = backend_of(plan.job).transport(plan)
    assert not ex.connect()
    try:
        t0 = time.perf_counter()
        report = run_checks(plan, ex, fast_only=True)
        took = time.perf_counter() - t0
    finally:
        ex.close()
    if not report.ok:
        print(report.table())
    return took


def node_cpu(hs, spec: dict, checks: bool) -> float:
    """Node CPU per host (s) of one connect, the fast checks when asked, and the close."""
    hosts = hs.hosts[:len(spec["cluster"]["hosts"])]
    before = reaped_cpu([h.sshd_pid for h in hosts])
    plan = build_plan(validate(spec))
    ex = backend_of(plan.job).transport(plan)
    assert not ex.connect()
    try:
        if checks:
            report = run_checks(plan, ex, fast_only=True)
            assert report.ok, report.table()
    finally:
        ex.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(len(h.pids()) > 1 for h in hosts):
        time.sleep(0.02)   # every session ended: its CPU is reaped into sshd's
    return (reaped_cpu([h.sshd_pid for h in hosts]) - before) / len(hosts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--fast", action="store_true", help="fast checks only, no all-reduce")
    ap.add_argument("--real-home", action="store_true", help="ssh sessions run root's ~/.bashrc")
    ap.add_argument("--mb", type=int, default=4, help="collective_mb")
    ap.add_argument("--hosts", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--node-cpu", action="store_true", help="the fast checks' node CPU per host")
    args = ap.parse_args()
    if args.node_cpu:
        return node_cpu_main(args)
    kind = "fast checks" if args.fast else "full check"
    with make_hosts(max(args.hosts), isolated_home=not args.real_home) as hs, \
            tempfile.TemporaryDirectory() as tmp:
        print(f"{kind}, median of {args.runs}, {'real' if args.real_home else 'isolated'} home")
        print(f"{'hosts':>5} {'median':>8} {'min':>8} {'max':>8}")
        for n in args.hosts:
            spec = spec_for(hs, tmp, n, args.mb)
            times = [fast_check(spec) if args.fast else full_check(spec, tmp) for _ in range(args.runs)]
            print(f"{n:>5} {statistics.median(times):>7.2f}s {min(times):>7.2f}s {max(times):>7.2f}s",
                  flush=True)


def node_cpu_main(args) -> None:
    with make_hosts(max(args.hosts), isolated_home=not args.real_home) as hs, \
            tempfile.TemporaryDirectory() as tmp:
        print(f"node CPU per host of the fast checks: connect+checks+close minus connect+close, "
              f"{args.runs} runs alternating, {'real' if args.real_home else 'isolated'} home")
        for n in args.hosts:
            spec = spec_for(hs, tmp, n, 4)
            pairs = [(node_cpu(hs, spec, False), node_cpu(hs, spec, True)) for _ in range(args.runs)]
            diffs = [b - a for a, b in pairs]
            print(f"{n:>5} hosts: checks {statistics.median(diffs) * 1000:.0f} ms a host "
                  f"(range {min(diffs) * 1000:.0f}-{max(diffs) * 1000:.0f}); connect+close alone "
                  f"{statistics.median(a for a, _ in pairs) * 1000:.0f} ms", flush=True)


if __name__ == "__main__":
    main()

"""Where submit's preflight spends its time, per part, on the namespace test hosts (root,
sshd; see tests/hosts.py), for one or more launcher trees alternating in one invocation:

  total         run_checks(fast_only=True) on a connected executor: what `submit` waits for
  facts         the facts probe on every node (with the mesh's first round)
  clock         each call of clock.sample: its seconds and how many sessions it asked for
  clock offset  one clock round alone, every node at once: each node's estimate and its
                uncertainty, in ms (the hosts share this machine's kernel clock: the true
                offset is 0, so the estimate is the method's own error)

  python bench/preflight_parts.py --hosts 16 --runs 5 [--tree /other/launcher/tree,...]

Each tree runs in a child interpreter of its own (PYTHONPATH=tree) on the same hosts and
spec. No assertions: this measures, the tests judge.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(spec_path: str, offsets: bool, without_mesh: bool = False) -> dict:
    """One measured preflight with the launcher on sys.path (this interpreter's tree).
    without_mesh: the facts probe without the mesh's first round (what the mesh costs it; the
    checks that read the mesh then fail, and its second round redoes it: read facts only)."""
    from launcher.backends import backend_of
    from launcher.plan.launch_plan import build_plan
    from launcher.preflight import clock, runner
    from launcher.preflight.probe import Ctx
    from launcher.spec import load_spec
    got: dict = {"facts": [], "clock": [], "clock_sessions": []}
    from bench.phases import timed
    timed(runner, "gather_facts", lambda _name, start, end: got["facts"].append(end - start))
    timed(clock, "sample", lambda _name, start, end: got["clock"].append(end - start))
    plain_on_nodes = clock.on_nodes

    def counted(ctx, script_for, timeout, ranks=None):
        got["clock_sessions"].append(len(ctx.live if ranks is None else ranks))
        return plain_on_nodes(ctx, script_for, timeout, ranks)
    clock.on_nodes = counted
    if without_mesh:
        from launcher.preflight import network
        network.first_round = lambda ctx: {}
    plan = build_plan(load_spec(spec_path))
    ex = backend_of(plan.job).transport(plan)
    assert not ex.connect()
    try:
        t0 = time.perf_counter()
        report = runner.run_checks(plan, ex, fast_only=True)
        got["total"] = time.perf_counter() - t0
        got["ok"] = report.ok
        if offsets:
            got["offsets"] = _one_round(clock, plain_on_nodes, Ctx(plan, ex))
    finally:
        ex.close()
    return got


def _one_round(clock, on_nodes, ctx) -> list:
    """One clock round on every node, uncounted: (offset ms, uncertainty ms) per node."""
    counted, clock.on_nodes = clock.on_nodes, on_nodes
    try:
        plain = clock.sample.__wrapped__
        if "rounds" in inspect.signature(plain).parameters:
            samples = plain(ctx, rounds=1)
        else:   # a tree from before the rounds: SAMPLES is read at each call
            keep, clock.SAMPLES = clock.SAMPLES, 1
            samples, clock.SAMPLES = plain(ctx), keep
    finally:
        clock.on_nodes = counted
    return sorted((round(s[0].offset_ms, 1), round(s[0].uncertainty_ms, 1))
                  for s in samples.values() if isinstance(s, list) and s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tree", default=ROOT, help="launcher source trees, comma-separated: alternated")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--offsets", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--without-mesh", action="store_true",
                    help="the facts probe without the mesh's first round (read its facts figure only)")
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.offsets, args.without_mesh)))
        return
    sys.path.insert(0, ROOT)
    from bench.preflight import spec_for
    from tests.helpers import write_spec
    from tests.hosts import make_hosts
    trees = args.tree.split(",")
    runs: dict[str, list[dict]] = {t: [] for t in trees}
    with make_hosts(args.hosts, isolated_home=True) as hs, tempfile.TemporaryDirectory() as tmp:
        spec = write_spec(tmp, spec_for(hs, tmp, args.hosts, 4))
        print(f"{args.hosts} hosts; {args.runs} runs per tree, alternating; trees {trees}")
        for i in range(args.runs):
            for t in trees:
                # then PYTHONPATH's own entries: on the GPU machine the carried wheels (device_kit.sh)
                kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
                env = {**os.environ, "PYTHONPATH": os.pathsep.join([t, ROOT, *kept])}
                r = subprocess.run([sys.executable, __file__, "--child", spec] + (["--offsets"] if i == 0 else [])
                                   + (["--without-mesh"] if args.without_mesh else []),
                                   env=env, cwd=t, capture_output=True, text=True, timeout=300)
                line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
                if line is None:
                    raise RuntimeError(r.stdout[-2000:] + r.stderr[-2000:])
                got = json.loads(line[7:])
                runs[t].append(got)
                print(f"run {i} {t:<24} total {got['total']:.3f} s  facts {sum(got['facts']):.3f} s  clock "
                      f"{[round(c, 3) for c in got['clock']]} s, sessions per round {got['clock_sessions']}"
                      f"{'' if got['ok'] else '  (checks FAILED)'}", flush=True)
                if "offsets" in got:
                    print(f"    one clock round (offset ms, ±ms): {got['offsets']}")
        print()
        for t in trees:
            tot = [g["total"] for g in runs[t]]
            facts = [sum(g["facts"]) for g in runs[t]]
            sessions = [sum(g["clock_sessions"]) for g in runs[t]]
            print(f"{t:<24} preflight median {statistics.median(tot):.3f} s (range {min(tot):.3f}-{max(tot):.3f}); "
                  f"facts probe median {statistics.median(facts):.3f} s; clock sessions per run median "
                  f"{statistics.median(sessions):g}")


if __name__ == "__main__":
    main()

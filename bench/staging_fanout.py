"""Staging throughput (issue 54): SIZE_MB (default 1 GB) staged to N namespace hosts that share no
disk, node to node (mlaunch's rounds: every holder feeds one node per round) against the launcher
copying to each host itself (all N copies from the launcher at once, as pdcp or a loop of rsync
would), both in one run, interleaved. Every link is shaped to the same rate (tc tbf: the
launcher's uplink on the bridge, each host's downlink on its veth and its uplink on its eth0), as
machines with one NIC each: what node to node saves is the launcher's uplink carrying N copies.
Each timing includes the launcher's manifest (hashing the source), the probe and every node's
hash check, as a submit pays them.

  python3 bench/staging_fanout.py [--hosts 8] [--size-mb 1024] [--rate 1gbit] [--runs 2]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launcher.plan import staging as fan  # noqa: E402
from launcher.plan.launch_plan import build_plan  # noqa: E402
from launcher.spec import SSH, validate  # noqa: E402
from launcher.transport import staging  # noqa: E402
from launcher.transport.ssh import SSHExecutor  # noqa: E402
from tests.helpers import script_job  # noqa: E402
from tests.hosts import make_hosts  # noqa: E402

NODE_TO_NODE = fan.rounds


def launcher_to_each(holders, lacking):
    """The baseline: one round, every copy from the launcher itself."""
    return [[fan.Copy(fan.LAUNCHER, t) for t in lacking]]


def shape(hs, rate: str) -> None:
    """Every link at rate: the bridge (the launcher's uplink), each veth (a host's downlink),
    each host's eth0 (its uplink)."""
    tbf = ["tbf", "rate", rate, "burst", "256kb", "latency", "50ms"]
    for dev in [hs.bridge, *(h.veth for h in hs.hosts)]:
        subprocess.run(["tc", "qdisc", "replace", "dev", dev, "root", *tbf], check=True)
    for h in hs.hosts:
        subprocess.run(["ip", "netns", "exec", h.ns, "tc", "qdisc", "replace", "dev", "eth0", "root", *tbf],
                       check=True)


def once(hs, plan, how) -> float:
    """Wall seconds of one staging to every host from nothing (connected first, not counted)."""
    for h in hs.hosts:
        shutil.rmtree(os.path.join(hs.disk_of(h), "blob"), ignore_errors=True)
        for suffix in (".mlaunch-manifest", ".mlaunch-tmp"):
            p = os.path.join(hs.disk_of(h), "blob" + suffix)
            shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else (os.path.exists(p) and os.unlink(p))
    ex = SSHExecutor([h.ip for h in hs.hosts], SSH(user="root", key_file=hs.key_file,
                                                   known_hosts=hs.known_hosts, connect_timeout=60))
    staging.rounds = how
    try:
        assert ex.connect() == []
        t = time.perf_counter()
        staging.stage(plan, ex, lambda line: print("   ", line, flush=True))
        return time.perf_counter() - t
    finally:
        staging.rounds = NODE_TO_NODE
        ex.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    with make_hosts(args.hosts, isolated_home=True, private_disk=True) as hs:
        src = os.path.join(hs.disk, "src")
        os.makedirs(src)
        for i in range(4):   # four files of a quarter each (a model's shards)
            with open(os.path.join(src, f"shard-{i}.bin"), "wb") as f:
                left = args.size_mb * (1 << 20) // 4
                while left:
                    n = min(left, 1 << 24)
                    f.write(os.urandom(n))
                    left -= n
        spec = script_job([h.ip for h in hs.hosts], 1, "staged_job.py", [], os.path.join(hs.disk, "out"), hs=hs)
        spec["staging"] = [{"src": src, "dst": os.path.join(hs.disk, "blob")}]
        plan = build_plan(validate(spec))
        shape(hs, args.rate)
        print(f"{args.size_mb} MB in 4 files to {args.hosts} hosts, every link at {args.rate}; "
              f"{os.cpu_count()} CPUs here")
        got = {"node to node": [], "launcher to each": []}
        for _ in range(args.runs):   # interleaved: each pair under the same load
            got["node to node"].append(once(hs, plan, NODE_TO_NODE))
            got["launcher to each"].append(once(hs, plan, launcher_to_each))
        a, b = statistics.median(got["launcher to each"]), statistics.median(got["node to node"])
        for k, v in got.items():
            print(f"{k}: " + ", ".join(f"{x:.1f} s" for x in v) + f" (median {statistics.median(v):.1f} s)")
        pairs = [x / y for x, y in zip(got["launcher to each"], got["node to node"])]
        print(f"ratio launcher-to-each / node-to-node: median {a / b:.2f} "
              f"(per pair: {', '.join(f'{p:.2f}' for p in pairs)}; n={args.runs})")


if __name__ == "__main__":
    main()

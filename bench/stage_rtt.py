"""Staging a plan's files on hosts over a slow link: one script a host (transport/ssh.py now,
render.stage_script) against SFTP, a request per file operation (as before 2026-12-03), at
0 and 10 ms added round-trip time (netem on each namespace host's link).

  python3 bench/stage_rtt.py [--hosts 8] [--runs 5]
"""
from __future__ import annotations

import argparse
import os
import posixpath
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launcher.transport.base import make_run_dirs, stage_files  # noqa: E402
from launcher.transport.ssh import SSHExecutor  # noqa: E402
from launcher.plan.launch_plan import build_plan  # noqa: E402
from launcher.spec import SSH, validate  # noqa: E402
from tests.hosts import make_hosts  # noqa: E402
from tests.training import lf_spec  # noqa: E402


def sftp_upload(ex: SSHExecutor, host: str, plan) -> None:
    """The staging before: the run dirs in one script, then each file over SFTP."""
    make_run_dirs(ex.run, host, plan)
    with ex._conns[host].client.open_sftp() as sftp:
        for f in plan.files:
            with sftp.open(posixpath.join(plan.run_dir, posixpath.basename(f.path)), "w") as fh:
                fh.chmod(0o600)
                fh.write(f.content.encode())


def one_script(ex: SSHExecutor, host: str, plan) -> None:
    stage_files(ex.run, host, plan)


def stage_s(hs, plan, how) -> float:
    """Wall seconds to stage plan on every host (connected first, not counted)."""
    ex = SSHExecutor([h.ip for h in hs.hosts], SSH(user="root", key_file=hs.key_file,
                                                   known_hosts=hs.known_hosts, connect_timeout=60))
    try:
        assert ex.connect() == []
        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=32) as pool:
            list(pool.map(lambda h: how(ex, h.ip, plan), hs.hosts))
        return time.perf_counter() - t
    finally:
        ex.close()


def netem(hs, delay_ms: int) -> bool:
    """delay_ms more on each host's link (0: none again); False where netem is missing."""
    ok = True
    for h in hs.hosts:
        r = subprocess.run(["tc", "qdisc", "replace" if delay_ms else "del", "dev", h.veth, "root",
                            *(["netem", "delay", f"{delay_ms}ms"] if delay_ms else [])], capture_output=True)
        ok = ok and r.returncode == 0
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with make_hosts(args.hosts, isolated_home=True) as hs, tempfile.TemporaryDirectory() as tmp:
        # A LLaMA-Factory plan: its YAML, ds_config and entry script go up (a script job has none).
        tiny = {"model": tmp, "template": "qwen", "dataset": "d", "dataset_dir": tmp}
        spec = lf_spec(tiny, [h.ip for h in hs.hosts], 1, os.path.join(tmp, "out"), hs=hs,
                       deepspeed={"stage": 2})
        plan = build_plan(validate(spec))
        print(f"{args.hosts} hosts, {len(plan.files)} files a host "
              f"({sum(len(f.content) for f in plan.files)} bytes)")
        for delay in (0, 10):
            if delay and not netem(hs, delay):
                print("no netem qdisc in this kernel: no added RTT")
                break
            got = {"sftp": [], "script": []}
            for _ in range(args.runs):   # interleaved, each pair in the same minute
                got["sftp"].append(stage_s(hs, plan, sftp_upload))
                got["script"].append(stage_s(hs, plan, one_script))
            a, b = statistics.median(got["sftp"]), statistics.median(got["script"])
            print(f"added RTT {delay} ms: SFTP per file median {a:.3f}s, one script median {b:.3f}s "
                  f"(ratio {a / b:.1f}; n={args.runs}: " + ", ".join(f"{x:.3f}/{y:.3f}" for x, y in
                                                                 zip(got['sftp'], got['script'])) + ")")
        netem(hs, 0)


if __name__ == "__main__":
    main()

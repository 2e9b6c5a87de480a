"""Run registry and detached-run benchmarks (the sshd namespace hosts need root; see tests/hosts.py).

  python bench/registry.py ps        # `mlaunch ps` with 1,000 runs in the registry; its imports
  python bench/registry.py detach    # submit -d: return after the last node started, vs foreground
  python bench/registry.py follow    # logs -f: a line written on a node -> the line printed

Every figure is a median of several runs measured in one session, in a private MLAUNCH_HOME.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from launcher.record.registry import Registry  # noqa: E402
from tests.helpers import script_job, write_spec  # noqa: E402

CLI = [sys.executable, "-m", "launcher.cli"]
HEAVY = ("fabric", "paramiko", "invoke", "pydantic", "jinja2", "yaml")


def _env(home: str) -> dict:
    return {**os.environ, "MLAUNCH_HOME": home, "PYTHONPATH": ROOT}


def _timed(argv: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def bench_ps(repeat: int) -> None:
    with tempfile.TemporaryDirectory() as home:
        reg = Registry(os.path.join(home, "runs.db"))
        me = (os.getpid(), _start(os.getpid()))
        for i in range(1000):
            run_id = f"job{i % 37}-20261201-{i:06d}-beef"
            reg.create(run_id, name=f"job{i % 37}", backend="ssh", hosts=[f"10.0.0.{k}" for k in range(4)],
                       spec={"name": "x", "cluster": {"hosts": ["10.0.0.1"] * 4}}, detached=False,
                       supervisor=me, log_dir=f"/tmp/logs/{run_id}", output_dir="/tmp/out")
            reg.attempt_started(run_id, 0, run_id, [f"/tmp/logs/{run_id}/node{k}.log" for k in range(4)], None)
            if i % 100:  # 10 stay running (with a live marker), 990 have ended
                reg.set_state(run_id, "succeeded" if i % 7 else "failed", exit_code=0 if i % 7 else 1)
        env = _env(home)
        rows = {}
        for args in (["ps"], ["ps", "--all"], ["ps", "--all", "--json"], ["--help"]):
            times = [_timed(CLI + args, env) for _ in range(repeat)]
            rows[" ".join(args)] = statistics.median(times)
        imp = subprocess.run([sys.executable, "-X", "importtime", "-m", "launcher.cli", "ps", "--all"],
                             env=env, cwd=ROOT, capture_output=True, text=True)
        mods = {ln.split("|")[-1].strip().split(".")[0] for ln in imp.stderr.splitlines() if "|" in ln}
        heavy = sorted(m for m in HEAVY if m in mods)
        bare = statistics.median(_timed([sys.executable, "-c", "pass"], env) for _ in range(repeat))
    for what, t in rows.items():
        print(f"mlaunch {what:<18} 1,000 runs: median {t:.3f} s (n={repeat})")
    print(f"python -c pass: {bare:.3f} s; heavy modules imported by `ps --all`: {heavy or 'none'}")


def _start(pid: int) -> int:
    from launcher.backends.ssh import proc_start
    return proc_start(pid)


def _hosts(n: int):
    from tests.hosts import make_hosts
    return make_hosts(n)


def bench_detach(repeat: int) -> None:
    with _hosts(2) as hs, tempfile.TemporaryDirectory() as tmp:
        env = _env(os.path.join(tmp, "home"))
        reg = Registry(os.path.join(tmp, "home", "runs.db"))
        fg, det, after = [], [], []
        for i in range(repeat):
            for mode in ("fg", "d"):
                spec = script_job([h.ip for h in hs.hosts], 2, "ticker.py", ["3", "0.1", "0"],
                                  os.path.join(tmp, f"{mode}{i}"), hs=hs)
                path = write_spec(tmp, spec, f"{mode}{i}.yaml")
                t0 = time.time()
                r = subprocess.run(CLI + ["submit", *(["-d"] if mode == "d" else []), path, "--no-preflight"],
                                   env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
                t1 = time.time()
                assert r.returncode == 0, r.stdout[-2000:] + r.stderr
                run = reg.runs(limit=1)[0]
                started = reg.attempts(run.id)[0].started
                (fg if mode == "fg" else det).append(started - t0)
                if mode == "d":
                    after.append(t1 - started)
                    _wait_end(reg, run.id)
    print(f"launch -> every node started, 2 hosts x 2: foreground {statistics.median(fg):.3f} s, "
          f"detached {statistics.median(det):.3f} s (ratio {statistics.median(det) / statistics.median(fg):.2f}, n={repeat})")
    print(f"submit -d returns {statistics.median(after):.3f} s after the last node started "
          f"(median; max {max(after):.3f} s, n={repeat})")


def _wait_end(reg: Registry, run_id: str) -> None:
    while reg.get(run_id).state in ("starting", "running", "restarting"):
        time.sleep(0.1)


def bench_follow(lines: int) -> None:
    with _hosts(2) as hs, tempfile.TemporaryDirectory() as tmp:
        env = _env(os.path.join(tmp, "home"))
        out = {}
        for view in ([], ["--node", "1"]):
            spec = script_job([h.ip for h in hs.hosts], 2, "ticker.py", [str(lines), "0.05", "0"],
                              os.path.join(tmp, f"out{len(view)}"), hs=hs)
            r = subprocess.run(CLI + ["submit", "-d", write_spec(tmp, spec, f"f{len(view)}.yaml"), "--no-preflight"],
                               env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stdout + r.stderr
            run_id = re.search(r"run (\S+) detached", r.stdout).group(1)
            t_follow = time.time()
            follower = subprocess.Popen(CLI + ["logs", "-f", run_id, *view], env=env, cwd=ROOT,
                                        stdout=subprocess.PIPE, text=True, bufsize=1)
            lat = []
            for line in follower.stdout:
                m = re.search(r" t (\d+\.\d+)$", line)
                if m and float(m.group(1)) > t_follow:  # older lines were on disk already
                    lat.append(time.time() - float(m.group(1)))
            assert follower.wait() == 0
            out[" ".join(view) or "console"] = lat
        for what, lat in out.items():
            lat.sort()
            print(f"logs -f ({what}): line written on a node -> printed: median {statistics.median(lat):.3f} s, "
                  f"p90 {lat[int(len(lat) * 0.9)]:.3f} s (n={len(lat)} lines, 4 ranks x 20 lines/s)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["ps", "detach", "follow", "all"])
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--lines", type=int, default=100)
    a = p.parse_args()
    if a.what in ("ps", "all"):
        bench_ps(a.repeat)
    if a.what in ("detach", "all"):
        bench_detach(a.repeat)
    if a.what in ("follow", "all"):
        bench_follow(a.lines)


if __name__ == "__main__":
    main()

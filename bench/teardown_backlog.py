"""Teardown under a log backlog: a local 2-node script job whose rank 0 prints 1 KB lines as
fast as it can; rank 1 exits 1 once rank 0 has written AFTER lines. Measured: the launcher's
decision (node 1's node_exit event) -> the last process of the run gone; and the backlog
then (what rank 0 had written that the node log did not yet hold).

Usage: python -m bench.teardown_backlog [RUNS] [AFTER_LINES] [--ssh]
  --ssh: the two nodes are namespace hosts reached over SSH (as root), their node logs
  spliced from the node relay (session/nodeoutput.py); otherwise both are this machine.
"""
from __future__ import annotations

import datetime
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from tests.helpers import ROOT, script_job, write_spec
from tests.procs import job_pids


def once(tmp: str, after: int, hs=None) -> dict:
    marker = os.path.join(tmp, "marker")
    if hs is None:
        spec = script_job(["localhost", "127.0.0.1"], 1, "flood_then_fail.py", [marker, str(after)],
                          os.path.join(tmp, "out"), cuda_visible_devices=[[0], [1]])
    else:   # two namespace hosts over SSH: the node logs spliced (session/nodeoutput.py)
        spec = script_job([h.ip for h in hs.hosts], 1, "flood_then_fail.py", [marker, str(after)],
                          os.path.join(tmp, "out"), hs=hs)
    spec["name"] = name = f"tdb{os.getpid()}x{len(os.listdir(os.path.dirname(tmp)))}"
    with open(os.path.join(tmp, "console"), "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", write_spec(tmp, spec),
                                 "--no-preflight"],   # its GPU check refuses cuda_visible_devices [1] on a 1-GPU machine
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        while not os.path.exists(marker):
            assert proc.poll() is None, open(os.path.join(tmp, "console")).read()[-3000:]
            time.sleep(0.01)
        while job_pids(name + "-"):
            time.sleep(0.02)
        gone = time.time()
        code = proc.wait()
    (ev,) = glob.glob(f"{tmp}/out/logs/*/events.jsonl")
    exits = [json.loads(line) for line in open(ev) if '"node_exit"' in line]
    t = next(e["time"] for e in exits if e.get("code"))
    decided = datetime.datetime.strptime(t, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()
    (log,) = glob.glob(f"{tmp}/out/logs/*/node0-*.log")
    (rank_file,) = glob.glob(f"/tmp/mlaunch*/.mlaunch/{name}-*/torchrun/node0/*/attempt_0/0/stdout.log")
    written, logged = os.path.getsize(rank_file), os.path.getsize(log)
    os.remove(rank_file)  # hundreds of MB per run
    return {"code": code, "decision_to_gone_s": round(gone - decided, 2),
            "rank0_wrote_mb": round(written / 2**20), "node_log_mb": round(logged / 2**20)}


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--ssh"]
    runs = int(args[0]) if args else 5
    after = int(args[1]) if len(args) > 1 else 300000
    if "--ssh" in sys.argv:
        from tests.hosts import make_hosts
        with make_hosts(2, isolated_home=True) as hs:
            series(runs, after, hs)
    else:
        series(runs, after)


def series(runs: int, after: int, hs=None) -> None:
    base = tempfile.mkdtemp(prefix="mlaunch-tdb-")
    results = []
    for i in range(runs):
        tmp = os.path.join(base, str(i))
        os.makedirs(tmp)
        results.append(once(tmp, after, hs))
        print(json.dumps(results[-1]), flush=True)
    times = [r["decision_to_gone_s"] for r in results]
    print(json.dumps({"runs": runs, "after_lines": after, "ssh": hs is not None,
                      "median_s": statistics.median(times), "max_s": max(times)}))


if __name__ == "__main__":
    main()

"""Issue 29, the Slurm variant: a restart after a node failure excludes the failed node."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from .helpers import ROOT, write_spec
from .slurmjobs import baseline, leftovers, slurm_script_job


@pytest.mark.multihost
def test_drained_node_is_excluded_from_the_restart_job(slurm3, tmp_path):
    keep = baseline(slurm3)
    out = tmp_path / "out"
    spec = slurm_script_job(tmp_path, "spare_job.py", [str(out)])   # 2 nodes of the 3
    spec |= {"max_restarts": 1, "restart_backoff_s": 1}
    env = {**os.environ, "SLURM_CONF": slurm3.conf}
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", write_spec(tmp_path, spec)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen, ready = [], 0
    for line in proc.stdout:
        seen.append(line)
        ready += "ready rank" in line
        if ready == 4:
            break
    first = re.search(r"slurm job (\d+) running on (\S+), (\S+)\n", "".join(seen))
    assert first, "".join(seen)
    lost = first.group(3)   # node 1 of the first attempt: drained, then its task killed
    slurm3.run(["scontrol", "update", f"nodename={lost}", "state=drain", "reason=test"])
    host = next(h for h in slurm3.hs.hosts if h.name == lost)
    ranks = [p for p in host.pids() if _environ_has(p, b"RANK=")]
    assert ranks, f"no rank of the job on {lost}"
    for pid in ranks:
        os.kill(pid, signal.SIGKILL)
    rest, _ = proc.communicate(timeout=300)
    console = "".join(seen) + rest
    assert proc.returncode == 0, console[-4000:]
    assert re.search(rf"slurm: the restart excludes {lost} \(Slurm state \S*DRAIN\S*: test\)", console), console
    jobs = re.findall(r"slurm job (\d+): 2 nodes requested; batch script (\S+)", console)
    assert len(jobs) == 2, console
    assert "--exclude" not in open(jobs[0][1]).read()
    assert f"#SBATCH --exclude={lost}\n" in open(jobs[1][1]).read()
    info = slurm3.run(["scontrol", "show", "job", "-o", jobs[1][0]]).stdout
    assert f"ExcNodeList={lost} " in info, info
    others = sorted(h.name for h in slurm3.hs.hosts if h.name != lost)
    second = re.search(rf"slurm job {jobs[1][0]} running on (\S+), (\S+)\n", console)
    assert second and sorted(second.groups()) == others, console
    done = sorted(open(p).read() for p in out.glob("done-rank*-attempt1"))
    assert len(done) == 4 and set(done) == set(others), done
    events = [json.loads(ln) for p in (out / "logs").glob("*/events.jsonl") for ln in open(p)]
    assert [(e["host"], e["reason"]) for e in events if e["event"] == "node_excluded"] == [
        (lost, re.search(rf"\(({re.escape('Slurm state')}[^)]*)\)", console).group(1))]
    assert leftovers(slurm3, keep) == {h.name: set() for h in slurm3.hs.hosts}
    assert slurm3.run(["squeue", "-h"]).stdout.strip() == ""


def _environ_has(pid: int, entry: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return any(e.startswith(entry) for e in fh.read().split(b"\0"))
    except OSError:
        return False

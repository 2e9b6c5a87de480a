"""Issue 29, the Slurm variant: a restart after a node failure excludes the failed node."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from launcher.execute.base import Exit
from launcher.execute.outcome import JobResult, NodeOutcome
from launcher.launch import slurm_exclude
from launcher.plan.launch_plan import build_plan
from launcher.spec import validate
from launcher.view.present import describe_plan

from .loadfactor import limit
from .helpers import ROOT, write_spec
from .slurmjobs import baseline, leftovers, slurm_script_job


class _Say:
    def __init__(self):
        self.lines: list[str] = []

    def say(self, line: str) -> None:
        self.lines.append(line)


class _Events:
    def __init__(self):
        self.got: list[tuple] = []

    def emit(self, event: str, **fields) -> None:
        self.got.append((event, fields))


def _job(tmp_path, **slurm):
    spec = slurm_script_job(tmp_path, "allreduce.py", [])
    spec["cluster"]["slurm"] |= slurm
    return validate(spec | {"max_restarts": 2})


def test_dry_run_says_a_restart_excludes_the_failed_nodes(tmp_path):
    text = describe_plan(build_plan(_job(tmp_path), run_id="r"))
    assert ("restarts under slurm: each is a new sbatch job; a restart excludes the nodes that "
            "failed (drained, down or failing in scontrol, or a lost task): --exclude, "
            "accumulated across attempts") in text, text


def test_exclusions_join_the_users_and_accumulate(tmp_path, monkeypatch):
    states = {"a": {}, "b": {"b": "Slurm state IDLE+DRAIN: test"}}
    job = _job(tmp_path, extra_sbatch={"exclude": "z"})
    say, events = _Say(), _Events()
    for attempt, hosts in enumerate([("a", "b"), ("a", "c")]):
        monkeypatch.setattr(slurm_exclude, "failed_nodes", lambda names: {
            n: why for n in names for why in [states.get(n, {}).get(n)] if why})
        lost = attempt == 1   # the second attempt loses c's task
        result = JobResult(code=1, nodes=[
            NodeOutcome(0, hosts[0], exit=Exit(1)),
            NodeOutcome(1, hosts[1], exit=Exit(143, lost=lost, detail="Killed"))])
        job = slurm_exclude.exclude_failed(job, result, say, events)
    assert job.cluster.slurm.extra_sbatch["exclude"] == "z,b,c"
    assert say.lines == ["slurm: the restart excludes b (Slurm state IDLE+DRAIN: test)",
                         "slurm: the restart excludes c (task lost (Killed))"]
    assert [e[1]["host"] for e in events.got] == ["b", "c"]
    plan = build_plan(job, run_id="r", attempt=2)
    from launcher.plan import sbatch
    assert "#SBATCH --exclude=z,b,c\n" in sbatch.request(plan).script


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
    rest, _ = proc.communicate(timeout=limit(300))
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

"""The Slurm backend on a real slurmctld + slurmd cluster (tests/hostkit/slurm.py)."""
from __future__ import annotations

import glob
import os
import re
import signal

import pytest

from .loadfactor import limit
from .runs import Runs
from .slurmjobs import baseline, environ_has, leftovers, slurm_script_job, submit, wait_until

pytestmark = pytest.mark.multihost


def test_allreduce_2x2_through_sbatch(slurm2, tmp_path):
    keep = baseline(slurm2)
    spec = slurm_script_job(tmp_path, "allreduce.py", [])
    r = submit(slurm2, tmp_path, spec)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    sums = re.findall(r"rank (\d+)/4 node (\d) sum (\d+) expected 6", r.stdout)
    assert sorted(int(s[0]) for s in sums) == [0, 1, 2, 3] and all(s[2] == "6" for s in sums), r.stdout
    names = [h.name for h in slurm2.hs.hosts]
    for k, name in enumerate(names):   # each line prefixed with its node and allocated host
        assert re.search(rf"^\[node{k} {name} local[01]\] rank \d/4 node {k} sum 6", r.stdout, re.M), r.stdout
    logs = sorted(glob.glob(str(tmp_path / "out" / "logs" / "*" / "node*.log")))
    assert [os.path.basename(p) for p in logs] == [f"node{k}-{n}.log" for k, n in enumerate(names)]
    for k, path in enumerate(logs):
        assert len(re.findall(rf"rank \d/4 node {k} sum 6", open(path).read())) == 2
    assert leftovers(slurm2, keep) == {n: set() for n in names}
    # the phase timeline: the run's files written, then the wait in Slurm's queue as its own
    # phase (from sbatch's job id to the allocation), then the nodes' start
    (events,) = glob.glob(str(tmp_path / "out" / "logs" / "*" / "events.jsonl"))
    from launcher.record.events import read_events
    from launcher.record.phases import timeline
    names_seen = [p.name for p in timeline(read_events(events))]
    assert names_seen[:4] == ["connect", "checkpoint", "stage", "queued"], names_seen
    assert names_seen[4] == "rendezvous", names_seen



def test_one_rank_exits_3_the_job_ends_with_3_and_nothing_is_left(slurm2, tmp_path):
    keep = baseline(slurm2)
    spec = slurm_script_job(tmp_path, "fail_or_sleep.py", ["1", "3", "2"])
    r = submit(slurm2, tmp_path, spec)
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr
    assert "rank 1 exiting 3" in r.stdout
    assert re.search(r"^\[mlaunch\] 0 +\S+ +exit 3$", r.stdout, re.M), r.stdout[-2000:]
    assert "failed (exit 3)" in r.stdout
    assert leftovers(slurm2, keep) == {h.name: set() for h in slurm2.hs.hosts}
    assert slurm2.run(["squeue", "-h"]).stdout.strip() == ""


@pytest.fixture
def runs(tmp_path, slurm2) -> Runs:
    runs = Runs(str(tmp_path / "home"))
    runs.env["SLURM_CONF"] = slurm2.conf
    return runs


def test_detached_run_ps_and_logs_follow(slurm2, tmp_path, runs):
    keep = baseline(slurm2)
    spec = slurm_script_job(tmp_path, "ticker.py", ["30", "0.2", "0"])
    run_id = runs.detach(tmp_path, spec)
    row = runs.run(run_id)
    assert row["backend"] == "slurm" and row["handle"]["job_id"], row
    assert row["state"] in ("starting", "running"), row
    runs.wait_console(run_id, r"tick rank \d node 1 i 3 ")
    assert runs.run(run_id)["state"] == "running"
    assert runs.run(run_id)["hosts"] == [h.name for h in slurm2.hs.hosts]
    follower = runs.popen("logs", "-f", run_id)
    followed, err = follower.communicate(timeout=limit(180))
    assert follower.returncode == 0, err
    assert re.search(r"tick rank [0-3] node [01] i 29 ", followed), followed[-2000:]
    row = runs.wait_state(run_id, ("succeeded", "failed", "stopped", "lost"))
    assert row["state"] == "succeeded" and row["exit_code"] == 0, row
    node1 = runs.cli("logs", run_id, "--node", "1")
    ticks = [ln for ln in node1.stdout.splitlines() if " tick rank " in ln]
    name1 = slurm2.hs.hosts[1].name
    assert len(ticks) == 60 and all(ln.startswith(f"[node1 {name1} local") for ln in ticks), ticks[:3]
    assert leftovers(slurm2, keep) == {h.name: set() for h in slurm2.hs.hosts}


def test_stop_of_a_running_slurm_job(slurm2, tmp_path, runs):
    keep = baseline(slurm2)
    spec = slurm_script_job(tmp_path, "fail_or_sleep.py", ["-1", "0", "0"])
    run_id = runs.detach(tmp_path, spec)
    runs.wait_console(run_id, r"ready rank \d", count=4)
    assert all(leftovers(slurm2, keep).values()), "the job's processes should be running"
    attach = runs.popen("attach", run_id)   # attach, then Ctrl-C: detaches, the job runs on
    wait_until(lambda: "ready rank" in (attach.stdout.readline() or "ready rank"), 60)
    attach.send_signal(signal.SIGINT)
    _, err = attach.communicate(timeout=limit(60))
    assert attach.returncode == 0 and "it keeps running" in err, err
    assert runs.run(run_id)["state"] == "running"
    assert all(leftovers(slurm2, keep).values()), "attach's Ctrl-C stopped the job"
    r = runs.cli("stop", run_id)
    assert r.returncode == 0, r.stdout + r.stderr
    assert leftovers(slurm2, keep) == {h.name: set() for h in slurm2.hs.hosts}
    row = runs.run(run_id)
    assert row["state"] == "stopped" and row["exit_code"] == 130, row
    assert slurm2.run(["squeue", "-h"]).stdout.strip() == ""


def test_unknown_partition_is_one_line_and_nothing_is_queued(slurm2, tmp_path):
    spec = slurm_script_job(tmp_path, "allreduce.py", [])
    spec["cluster"]["slurm"]["partition"] = "nosuch"
    r = submit(slurm2, tmp_path, spec)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("mlaunch:")]
    assert len(errors) == 1, r.stderr
    assert errors[0].startswith("mlaunch: cluster.slurm.partition: sbatch refused the job: ")
    assert "invalid partition" in errors[0].lower(), errors[0]
    assert "Traceback" not in r.stderr
    assert slurm2.run(["squeue", "-h"]).stdout.strip() == ""


def test_check_runs_the_checklist_through_srun_in_an_allocation(slurm2, tmp_path):
    from .helpers import mlaunch, write_spec
    keep = baseline(slurm2)
    spec = slurm_script_job(tmp_path, "allreduce.py", [])
    spec["preflight"] = {"min_free_gb": 0.01, "collective_mb": 1}
    r = mlaunch("check", write_spec(tmp_path, spec), env={"SLURM_CONF": slurm2.conf}, timeout=400)
    rows = {ln.split()[0]: ln for ln in r.stdout.splitlines() if ln.strip()}
    assert "allocation" in rows and "ssh" not in rows, r.stdout + r.stderr
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"4 ranks \(gloo\): correct", r.stdout), r.stdout
    assert slurm2.run(["squeue", "-h"]).stdout.strip() == ""   # the allocation was given back
    assert leftovers(slurm2, keep) == {h.name: set() for h in slurm2.hs.hosts}


def test_ctrl_c_cancels_and_secrets_stay_out_of_slurm(slurm2, tmp_path):
    import signal
    import subprocess
    import sys
    from .helpers import ROOT, write_spec
    keep = baseline(slurm2)
    secret = "s3cr3t-value-42"
    spec = slurm_script_job(tmp_path, "fail_or_sleep.py", ["-1", "0", "0"],
                            env={"HF_TOKEN": secret})
    env = {**os.environ, "SLURM_CONF": slurm2.conf}
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", write_spec(tmp_path, spec)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen, ready = [], 0
    for line in proc.stdout:
        seen.append(line)
        ready += "ready rank" in line
        if ready == 4:
            break
    job = re.search(r"slurm job (\d+):", "".join(seen)).group(1)
    stored = slurm2.run(["scontrol", "write", "batch_script", job, "-"]).stdout
    assert "#SBATCH --nodes=2" in stored and secret not in stored
    secrets = glob.glob(str(tmp_path / "shared" / ".mlaunch" / "*" / "*" / "secrets" / "env.sh"))
    assert len(secrets) == 1 and os.stat(secrets[0]).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(secrets[0])).st_mode & 0o777 == 0o700
    node_sh = open(os.path.join(os.path.dirname(os.path.dirname(secrets[0])), "node.sh")).read()
    assert secret not in node_sh
    ranks = [p for h in slurm2.hs.hosts for p in h.pids() if environ_has(p, b"RANK=")]
    assert ranks and all(environ_has(p, f"HF_TOKEN={secret}".encode()) for p in ranks)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=limit(120))
    assert proc.returncode == 130, "".join(seen) + rest
    assert f"interrupted: scancel {job}" in rest and "has left every node" in rest, rest
    assert leftovers(slurm2, keep) == {h.name: set() for h in slurm2.hs.hosts}
    assert slurm2.run(["squeue", "-h"]).stdout.strip() == ""
    assert not os.path.exists(secrets[0]), "the secrets file outlived the run"
    assert secret not in "".join(seen) + rest

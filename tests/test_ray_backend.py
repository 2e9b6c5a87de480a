"""The Ray backend on a real Ray cluster of three namespace hosts (tests/hostkit/raycluster.py,
fixture ray3): a gloo all-reduce across the three Ray nodes with every node's output
prefixed; a detached run's stop, after which no process of the run is left on any host (by
PID, per namespace), Ray holds none of its agents nor its placement group, and the cluster
runs the next job."""
from __future__ import annotations

import glob
import os
import re

import pytest

from .helpers import mlaunch, write_spec
from .raynodes import ray_script_job, ray_state, run_procs, run_procs_left, still_alive
from .runs import Runs

pytestmark = pytest.mark.multihost


def submit(tmp_path, spec: dict, *args: str, timeout: float = 300):
    return mlaunch("submit", write_spec(tmp_path, spec), *args, timeout=timeout,
                   env={"MLAUNCH_HOME": str(tmp_path / "home")})


def test_allreduce_across_three_ray_nodes(ray3, tmp_path):
    r = submit(tmp_path, ray_script_job(ray3, tmp_path, "allreduce.py", []))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    sums = re.findall(r"rank (\d+)/6 node (\d) sum (\d+) expected 15", r.stdout)
    assert sorted(int(s[0]) for s in sums) == list(range(6)) and {s[2] for s in sums} == {"15"}, r.stdout
    for k in range(3):   # every line prefixed with its node and its bundle, as ssh's are
        assert len(re.findall(rf"^\[node{k} bundle{k} local[01]\] rank \d/6 node {k} sum 15",
                              r.stdout, re.M)) == 2, r.stdout
    # one bundle per Ray node: three different nodes, node 0's the master
    placed = re.findall(r"^\[mlaunch\] ray: node(\d) bundle\d: Ray node (\S+)$", r.stdout, re.M)
    assert len({ip for _, ip in placed}) == 3 and {ip for _, ip in placed} == {h.ip for h in ray3.hs}
    logs = sorted(glob.glob(str(tmp_path / "out" / "logs" / "*" / "node*.log")))
    assert [os.path.basename(p) for p in logs] == [f"node{k}-bundle{k}.log" for k in range(3)]
    run_id = re.search(r"job (\S+) succeeded", r.stdout).group(1)
    assert run_procs_left(ray3, run_id) == {h.name: set() for h in ray3.hs}
    state = ray_state(ray3, run_id)
    assert state["agents"] == [] and set(state["groups"]) <= {"REMOVED"}, state


def test_a_rank_failing_ends_the_run_with_its_code_and_nothing_is_left(ray3, tmp_path):
    spec = ray_script_job(ray3, tmp_path, "fail_or_sleep.py", ["4", "3", "1"])
    r = submit(tmp_path, spec, "--no-preflight")
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr
    assert re.search(r"^\[node2 bundle2 local0\] rank 4 exiting 3$", r.stdout, re.M), r.stdout[-3000:]
    run_id = re.search(r"run (\S+): 3 nodes", r.stdout).group(1)
    assert run_procs_left(ray3, run_id) == {h.name: set() for h in ray3.hs}


def test_stop_of_a_detached_run_leaves_nothing_and_the_cluster_runs_the_next_job(ray3, tmp_path):
    runs = Runs(str(tmp_path / "home"))
    run_id = runs.detach(tmp_path, ray_script_job(ray3, tmp_path, "fail_or_sleep.py", ["-1", "0", "0"]))
    runs.wait_console(run_id, r"ready rank \d pid", count=6, timeout=240)
    row = runs.run(run_id)
    assert row["backend"] == "ray" and row["state"] == "running", row
    assert row["handle"]["ray_address"] == ray3.address and row["hosts"] == ["bundle0", "bundle1", "bundle2"]
    procs = run_procs(ray3, run_id)
    assert all(len(ps) >= 4 for ps in procs.values()), procs   # agent, relay, shell, torchrun, ranks
    node1 = runs.cli("logs", run_id, "--node", "1")
    assert re.search(r"^\[node1 bundle1 local[01]\] ready rank [23] pid", node1.stdout, re.M), node1.stdout
    stop = runs.cli("stop", run_id, timeout=240)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert still_alive(procs) == {h.name: set() for h in ray3.hs}
    assert run_procs_left(ray3, run_id) == {h.name: set() for h in ray3.hs}
    assert runs.run(run_id)["state"] == "stopped", open(runs.console_path(run_id)).read()[-3000:]
    state = ray_state(ray3, run_id)
    assert state["agents"] == [] and set(state["groups"]) <= {"REMOVED"} and state["alive"] == 3, state
    r = submit(tmp_path / "next" if (tmp_path / "next").mkdir() is None else tmp_path,
               ray_script_job(ray3, tmp_path / "next", "allreduce.py", []))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert len(re.findall(r"sum 15 expected 15", r.stdout)) == 6


def test_ctrl_c_of_a_foreground_run_tears_it_down_on_every_ray_node(ray3, tmp_path):
    import signal
    import subprocess
    import sys
    import time
    from .helpers import ROOT, limit
    spec = ray_script_job(ray3, tmp_path, "fail_or_sleep.py", ["-1", "0", "0"])
    env = {**os.environ, "MLAUNCH_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", write_spec(tmp_path, spec),
                             "--no-preflight"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen, deadline = [], time.monotonic() + limit(240)
    while len([ln for ln in seen if re.search(r"\] ready rank \d pid", ln)]) < 6:
        line = proc.stdout.readline()
        assert line and time.monotonic() < deadline, "".join(seen)[-3000:]
        seen.append(line)
    run_id = next(re.search(r"run (\S+): 3 nodes", ln).group(1) for ln in seen if re.search(r"run \S+: 3 nodes", ln))
    procs = run_procs(ray3, run_id)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=limit(240))
    assert proc.returncode == 130, "".join(seen)[-2000:] + out[-3000:] + err
    assert "interrupted: tearing down" in out
    assert still_alive(procs) == {h.name: set() for h in ray3.hs}
    assert run_procs_left(ray3, run_id) == {h.name: set() for h in ray3.hs}
    state = ray_state(ray3, run_id)
    assert state["agents"] == [] and set(state["groups"]) <= {"REMOVED"} and state["alive"] == 3, state


def test_check_and_exec_run_through_the_ray_agents(ray3, tmp_path):
    """`mlaunch check` on the placed bundles, the collective included (its master is bundle 0's
    Ray node), and `mlaunch exec` on every bundle with node prefixes; nothing of either left."""
    path = write_spec(tmp_path, ray_script_job(ray3, tmp_path, "allreduce.py", [], nproc=1))
    env = {"MLAUNCH_HOME": str(tmp_path / "home")}
    r = mlaunch("check", path, env=env, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert re.search(r"^collective +✓ 3 ranks \(gloo\): correct", r.stdout, re.M), r.stdout
    assert re.search(r"^network/port-reachable +✓ +✓ +✓", r.stdout, re.M), r.stdout
    r = mlaunch("exec", path, "--", "hostname", env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    names = dict(re.findall(r"^\[node(\d) bundle\d\] (\S+)$", r.stdout, re.M))
    assert sorted(names.values()) == sorted(h.name for h in ray3.hs), r.stdout

"""A Ray node taken away mid-run while the cluster has another free node: the restart's new
placement group puts the lost node's bundle on that node (Ray's own spare), the world stays
the same. A script job (tests/scripts/spare_job.py: the first attempt sleeps, the restart
writes a marker per rank) on 2 of the 3 Ray nodes; the raylet of a bundle's host that is not
the head is SIGKILLed once every rank is up. Its own Ray cluster: the test leaves it one node
short."""
from __future__ import annotations

import os
import re
import signal

import pytest

from .helpers import mlaunch, write_spec
from .raynodes import ray_script_job, run_procs_left
from .runs import Runs

pytestmark = pytest.mark.multihost


def test_lost_ray_node_is_replaced_by_a_free_one_world_kept(ray3, tmp_path):
    runs = Runs(str(tmp_path / "home"))
    out = tmp_path / "out"
    spec = ray_script_job(ray3, tmp_path, "spare_job.py", [str(out)], nodes=2, nproc=1)
    spec.update(max_restarts=1, restart_backoff_s=1)
    out.mkdir()
    run_id = runs.detach(tmp_path, spec)
    console = runs.wait_console(run_id, r"where rank \d/2 node \d host \S+ attempt 0", count=2, timeout=240)
    placed = dict(re.findall(r"^\[mlaunch\] ray: node(\d) bundle\d: Ray node (\S+)$", console, re.M))
    by_ip = {h.ip: h for h in ray3.hs}
    victim = next(by_ip[ip] for ip in placed.values() if by_ip[ip] is not ray3.head)
    free = next(h for h in ray3.hs if h.ip not in placed.values())
    os.kill(ray3.raylet_pid(victim), signal.SIGKILL)
    row = runs.wait_state(run_id, ("succeeded", "failed", "stopped", "lost"), timeout=600)
    console = open(runs.console_path(run_id)).read()
    assert row["state"] == "succeeded" and row["attempts"] == 2, console[-4000:]
    assert f"ray: node {victim.ip} is gone from the Ray cluster" in console
    assert "shrink" not in console
    again = re.findall(r"^\[mlaunch\] ray: node(\d) bundle\d: Ray node (\S+)$", console, re.M)[2:]
    assert {ip for _, ip in again} == ({*placed.values()} - {victim.ip}) | {free.ip}, again
    done = sorted(p.name for p in out.iterdir() if p.name.startswith("done-"))
    assert done == ["done-rank0-attempt1", "done-rank1-attempt1"], done
    assert run_procs_left(ray3, run_id) == {h.name: set() for h in ray3.hs}

"""A node that cannot be started fails its attempt: it is the first failure, the nodes that
did start are torn down, and the attempt's exit is not 0 (it was 0 when every node failed to
start: the teardown began before the failures were recorded)."""
from __future__ import annotations

import io

import pytest

from launcher.logs.stream import Printer
from launcher.plan.launch_plan import build_plan
from launcher.session.attempt import run_job
from launcher.session.outcome import JobResult
from launcher.spec import validate
from launcher.transport.base import LOST
from launcher.transport.local import LocalExecutor

from .helpers import free_port, limit
from .procs import job_pids, job_pids_left, own_name


class Unstartable(LocalExecutor):
    """Starts the ranks in `ok`; every other rank's start raises, as a transport's would."""

    def __init__(self, ok: set[int]):
        self.ok = ok

    def start(self, node):
        if node.rank not in self.ok:
            raise OSError(f"no such interpreter for node{node.rank}")
        return super().start(node)


def _attempt(tmp_path, ok: set[int]) -> JobResult:
    job = validate({"name": "s", "trainer": "script",
                    "script": {"path": "/bin/sleep", "args": ["600"]},
                    "cluster": {"hosts": ["localhost", "localhost"], "gpus_per_node": 1,
                                "cuda_visible_devices": [[0], [1]], "master_port": free_port()},
                    "output_dir": str(tmp_path / "out")})
    # A run id and a port of its own: the teardown ends processes by run id, on this machine
    # where other tests run at the same time.
    plan = build_plan(job, run_id=own_name("sf-"), log_dir=str(tmp_path / "logs"))
    return run_job(plan, Unstartable(ok), Printer(plan.mask, io.StringIO(), color=False))


@pytest.mark.launches
@pytest.mark.parametrize("ok", [set(), {0}])
def test_a_node_that_cannot_start_fails_the_attempt(tmp_path, ok):
    result = _attempt(tmp_path, ok)
    failed = result.first_failure   # both nodes start at once: where neither can, either is first
    assert result.code == LOST and failed in {0, 1} - ok, result
    node = result.nodes[failed]
    assert node.exit.lost and "could not start: no such interpreter" in node.exit.detail
    assert not node.terminated
    for rank in ok:   # the node that started was torn down, not left running
        assert result.nodes[rank].terminated and result.nodes[rank].exit is not None


@pytest.mark.launches
def test_a_node_whose_output_a_stray_process_holds_is_cut_after_the_settle(tmp_path, monkeypatch):
    """Node 1 exits 3; node 0 is torn down, but a process its setup line started, in a session
    of its own and without the run's variables, escapes the teardown and holds the node's
    output: the relay would wait on it for ever. After the settle the local session is cut
    as an ssh one is (its relay ended), so the attempt ends and says what happened."""
    import os
    import signal
    import sys

    from launcher.session import attempt

    monkeypatch.setattr(attempt, "SETTLE_S", 0.5)
    stray = tmp_path / "stray.pid"
    script = tmp_path / "job.py"
    script.write_text("import os, sys, time\nsys.exit(3) if os.environ['RANK'] == '1' else time.sleep(600)\n")
    run_id = own_name("sf-")
    job = validate({"name": "s", "trainer": "script", "script": {"path": str(script)},
                    "cluster": {"hosts": ["localhost", "localhost"], "gpus_per_node": 1, "python": sys.executable,
                                "cuda_visible_devices": [[0], [1]], "master_port": free_port(),
                                "setup": [f'[ "$MLAUNCH_NODE_RANK" != 0 ] || {{ env -u MLAUNCH_RUN_ID '
                                          f'-u MLAUNCH_NODE_ID setsid sleep 600 & echo $! > {stray}; }}']},
                    "output_dir": str(tmp_path / "out")})
    plan = build_plan(job, run_id=run_id, log_dir=str(tmp_path / "logs"))
    try:
        result = run_job(plan, LocalExecutor(), Printer(plan.mask, io.StringIO(), color=False))
        assert result.first_failure == 1 and result.nodes[1].exit.code == 3, result
        assert result.nodes[0].terminated and result.nodes[0].exit is not None, result
        assert job_pids_left(run_id, limit(10)) == set()   # the run's own processes: every one ended
        pid = int(stray.read_text())
        os.kill(pid, 0)   # the stray is still there (it was outside the run): only the wait on it ended
    finally:
        if stray.exists():
            os.kill(int(stray.read_text()), signal.SIGKILL)


@pytest.mark.launches
def test_a_job_that_succeeds_ends_though_a_setup_daemon_holds_a_nodes_output(tmp_path):
    """Every rank exits 0, but node 0's setup line left a daemon (in a session of its own,
    without the run's variables) that holds the node's output: nothing tears it down, and the
    relay's wait for the output's end would have kept the attempt open for ever. The relay
    ends AFTER_EXIT_S after the node's command: the attempt ends 0; the daemon is left."""
    import os
    import signal

    from .helpers import script_job

    daemon = tmp_path / "daemon.pid"
    spec = script_job(["localhost", "localhost"], 1, "steps.py", ["2", "0"], str(tmp_path / "out"),
                      cuda_visible_devices=[[0], [1]],
                      setup=[f'[ "$MLAUNCH_NODE_RANK" != 0 ] || {{ env -u MLAUNCH_RUN_ID '
                             f'-u MLAUNCH_NODE_ID setsid sleep 600 & echo $! > {daemon}; }}'])
    plan = build_plan(validate(spec), run_id=own_name("sd-"), log_dir=str(tmp_path / "logs"))
    try:
        result = run_job(plan, LocalExecutor(), Printer(plan.mask, io.StringIO(), color=False))
        assert result.code == 0 and [n.exit.code for n in result.nodes] == [0, 0], result
        os.kill(int(daemon.read_text()), 0)   # left running: it was never the run's
    finally:
        if daemon.exists():
            os.kill(int(daemon.read_text()), signal.SIGKILL)

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
                                "cuda_visible_devices": [[0], [1]]},
                    "output_dir": str(tmp_path / "out")})
    plan = build_plan(job, run_id="s", log_dir=str(tmp_path / "logs"))
    return run_job(plan, Unstartable(ok), Printer(plan.mask, io.StringIO(), color=False))


@pytest.mark.launches
@pytest.mark.parametrize("ok", [set(), {0}])
def test_a_node_that_cannot_start_fails_the_attempt(tmp_path, ok):
    result = _attempt(tmp_path, ok)
    failed = min({0, 1} - ok)
    assert result.code == LOST and result.first_failure == failed, result
    node = result.nodes[failed]
    assert node.exit.lost and "could not start: no such interpreter" in node.exit.detail
    assert not node.terminated
    for rank in ok:   # the node that started was torn down, not left running
        assert result.nodes[rank].terminated and result.nodes[rank].exit is not None

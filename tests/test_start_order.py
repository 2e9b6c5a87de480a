"""Every node's script is sent before any node's log, events and output thread are set up
(session/attempt.py _start_all): with many nodes the last one starts as soon as it can, while
the first ones' imports already take the cores the launcher shares with them. Each node's
node_start event still says when that node was started."""
from __future__ import annotations

import io
import json
import os
import threading

import pytest

from launcher.logs.stream import Printer
from launcher.plan.launch_plan import build_plan
from launcher.session import attempt
from launcher.spec import validate
from launcher.transport.local import LocalExecutor

from .helpers import script_job
from .procs import own_name


class Recording(LocalExecutor):
    """Records each start; node 1's waits (at most 2 s) for node 0's output to be followed,
    which a launcher that follows each node as it starts it does at once."""

    def __init__(self, said: list, followed: threading.Event):
        self.said, self.followed = said, followed

    def start(self, node):
        if node.rank == 1:
            self.followed.wait(2)
        self.said.append(("start", node.rank))
        return super().start(node)


@pytest.mark.launches
def test_every_node_is_started_before_any_nodes_output_is_followed(tmp_path, monkeypatch):
    said: list = []
    followed = threading.Event()
    made = attempt.NodeOutput

    def output(node, *a, **k):
        said.append(("follow", node.rank))
        followed.set()
        return made(node, *a, **k)

    monkeypatch.setattr(attempt, "NodeOutput", output)
    job = validate(script_job(["localhost"] * 2, 1, "steps.py", ["1", "0"], str(tmp_path / "out"),
                              cuda_visible_devices=[[0], [1]]))
    plan = build_plan(job, run_id=own_name("so-"), log_dir=str(tmp_path / "logs"))
    result = attempt.run_job(plan, Recording(said, followed), Printer(plan.mask, io.StringIO(), color=False))
    assert result.code == 0, result
    assert sorted(said[:2]) == [("start", 0), ("start", 1)]
    assert sorted(said[2:]) == [("follow", 0), ("follow", 1)]
    with open(os.path.join(plan.log_dir, "events.jsonl")) as fh:
        starts = [e for e in map(json.loads, fh) if e["event"] == "node_start"]
    assert sorted(e["node"] for e in starts) == [0, 1] and all(e["time"] for e in starts)

"""Issue 29, spare hosts with a real trainer: LLaMA-Factory LoRA on CPU over namespace hosts."""
from __future__ import annotations

import glob
import json
import os
import threading
import time

import pytest

from .helpers import limit
from .test_fanout import start
from .training import build_tiny, lf_spec, losses, require_trainer, trainer_state

pytestmark = [pytest.mark.multihost, pytest.mark.training]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    require_trainer()
    return build_tiny(str(tmp_path_factory.mktemp("tiny")))


def test_lora_lost_node_resumes_on_the_spare(make_hostset, tmp_path, tiny):
    """2 nodes + 1 spare: node 1's link is cut after checkpoint-5; the restart runs on the
    spare with the same world, resumes from a checkpoint, reaches max_steps, and its first
    logged step comes after that checkpoint (the loss curve continues)."""
    with make_hostset(3) as hs:
        a, b, spare = hs.hosts
        out = str(tmp_path / "out")
        spec = lf_spec(tiny, [a.ip, b.ip], 1, out, hs=hs, max_steps=30, save_steps=5,
                       max_restarts=1, restart_backoff_s=0)
        spec["cluster"] |= {"spare_hosts": [spare.ip], "hangup_after_s": 6}
        proc = start(tmp_path, spec)
        lines: list[str] = []   # read all along: a full pipe would stall mlaunch
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        _wait_for_file(os.path.join(out, "checkpoint-5", "trainer_state.json"), limit(400), proc)
        b.link_down()
        proc.wait(timeout=limit(600))
        reader.join(limit(60))
        rest = "".join(lines)
    assert proc.returncode == 0, rest[-4000:]
    assert f"host replaced: node1 {b.ip} -> spare {spare.ip}" in rest, rest[-4000:]
    assert trainer_state(out)["global_step"] == 30
    (path,) = glob.glob(f"{out}/logs/*/events.jsonl")
    events = [json.loads(ln) for ln in open(path)]
    restart = next(e for e in events if e["event"] == "restart")
    resumed = int(restart["resume_from"].rsplit("-", 1)[1])
    # step events are sampled, and the first of an attempt may carry no step number
    steps = [e["step"] for e in events if e["event"] == "step" and e.get("attempt") == 1
             and "step" in e]
    assert steps and steps[0] > resumed >= 5, (resumed, steps)
    assert sorted(losses(trainer_state(out))) == list(range(1, 31))   # one curve, 1 to 30


def _wait_for_file(path: str, timeout: float, proc) -> None:
    """Until path exists (the event the test waits on); fails when the run ends first."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None, f"the run ended before {path}"
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.2)

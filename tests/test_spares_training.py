"""Issue 29, spare hosts with a real trainer: LLaMA-Factory LoRA on CPU over namespace hosts."""
from __future__ import annotations

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
    """3 nodes + 1 spare (the issue's form): node 1's link is cut once training has logged a
    step past checkpoint-5; the restart runs on the spare with the same world, resumes from
    checkpoint-5 and reaches max_steps. Its loss curve continues the first attempt's: the first
    attempt is the uninterrupted run of the same spec (seed 7, constant LR, same data) up to
    the cut, and every step both attempts trained (after checkpoint-5) has the same loss, to
    rel 1e-5 (the bound test_training.py's kill-and-resume run holds on the same hosts)."""
    with make_hostset(4) as hs:
        a, b, c, spare = hs.hosts
        out = str(tmp_path / "out")
        spec = lf_spec(tiny, [a.ip, b.ip, c.ip], 1, out, hs=hs, max_steps=12, save_steps=5,
                       max_restarts=1, restart_backoff_s=0)
        spec["cluster"] |= {"spare_hosts": [spare.ip], "hangup_after_s": 6}
        proc = start(tmp_path, spec)
        lines: list[str] = []   # read all along: a full pipe would stall mlaunch
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        log = os.path.join(out, "trainer_log.jsonl")   # LLaMA-Factory's, appended on resume
        _wait_for(lambda: os.path.exists(os.path.join(out, "checkpoint-5", "trainer_state.json"))
                  and max(_logged(log), default=(0,))[0] >= 6, limit(400), proc, "step 6 logged")
        b.link_down()
        proc.wait(timeout=limit(600))
        reader.join(limit(60))
        rest = "".join(lines)
    assert proc.returncode == 0, rest[-4000:]
    assert (f"host replaced: node1 {b.ip} -> spare {spare.ip} (connection lost); the world stays "
            "3 processes") in rest, rest[-4000:]
    assert f"restart 1/1: resuming from {out}/checkpoint-5" in rest, rest[-4000:]
    state = trainer_state(out)
    assert state["global_step"] == 12 and sorted(losses(state)) == list(range(1, 13))
    logged = _logged(log)   # (step, loss) in write order: attempt 0 up to the cut, then attempt 1
    restart = next(i for i in range(1, len(logged)) if logged[i][0] <= logged[i - 1][0])
    first, second = dict(logged[:restart]), dict(logged[restart:])
    assert min(second) == 6 and max(second) == 12 and max(first) >= 6, logged
    both = sorted(set(first) & set(second))
    assert both, logged
    for step in both:   # the same step, trained again on the spare from checkpoint-5
        assert second[step] == pytest.approx(first[step], rel=1e-5), (step, first, second)
    for step, loss in losses(state).items():   # the final curve: attempt 0's to 5, then the spare's
        assert loss == pytest.approx(first[step] if step <= 5 else second[step], rel=1e-5), step
    print(f"[losses] attempt 0 (uninterrupted): {first}; attempt 1 on the spare: {second}")


def _logged(path: str) -> list[tuple[int, float]]:
    """(current_steps, loss) of each line of LLaMA-Factory's trainer_log.jsonl so far."""
    try:
        with open(path) as fh:
            rows = [json.loads(ln) for ln in fh if ln.strip().endswith("}")]
    except OSError:
        return []
    return [(r["current_steps"], r["loss"]) for r in rows if "loss" in r]


def _wait_for(cond, timeout: float, proc, what: str) -> None:
    """Until cond() (the event the test waits on); fails when the run ends first."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)

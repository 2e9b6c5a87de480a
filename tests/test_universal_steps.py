"""Issue 50: after a ZeRO universal load each optimizer state has its own step, equal to the
checkpoint's, and advances once per optimizer step. DeepSpeed 0.19.8's ZeRO-3 loader gives
every parameter group one shared step tensor, which torch's AdamW then increments once per
group: the reproduction (tests/scripts/universal_step_repro.py, docs/upstream-zero3-universal-step.md)
shows it unfixed, and mlaunch's entry snippet (templates/universal_steps.py.j2, rendered into
llamafactory_entry.py and swift_entry.py) fixes it. Saved at world 2 after 3 steps, loaded at
world 1, 2 more steps: a right loader reads 3 and ends at 5."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from launcher import render

from .helpers import ROOT, free_port
from .loadfactor import limit
from .training import TRAINER_VENV, require_trainer

pytestmark = pytest.mark.training

REPRO = os.path.join(ROOT, "tests", "scripts", "universal_step_repro.py")


def _run(argv: list[str], cwd, **env: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=limit(300))
    assert r.returncode == 0, (argv, r.stdout[-3000:], r.stderr[-3000:])
    return r.stdout + r.stderr


def _saved_and_converted(tmp_path, stage: str) -> str:
    """A checkpoint of 3 steps at world 2, converted by ds_to_universal: its directory."""
    bindir, ck = os.path.join(TRAINER_VENV, "bin"), str(tmp_path / "ck")
    _run([f"{bindir}/torchrun", "--nproc_per_node", "2", "--master_port", str(free_port()), REPRO, "save", ck, stage], tmp_path)
    _run([f"{bindir}/python", "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
          f"{ck}/global_step3", "--output_folder", f"{ck}/global_step3_universal",
          "--inject_missing_state", "--num_extract_workers", "1", "--num_merge_workers", "1"], tmp_path)
    return ck


def _loaded(tmp_path, ck: str, stage: str, fix: bool) -> tuple[dict, str]:
    """The repro's load at world 1 (with mlaunch's rendered entry snippet when fix): its JSON
    line and its whole output. One process given torchrun's variables: a torchrun agent for a
    world of 1 adds only its own start-up (about 1.4 s of CPU)."""
    argv = [os.path.join(TRAINER_VENV, "bin", "python"), REPRO, "load", ck, stage]
    if fix:
        entry = tmp_path / "llamafactory_entry.py"
        entry.write_text(render.llamafactory_entry())
        argv += ["--fix", str(entry)]
    out = _run(argv, tmp_path, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    (line,) = [ln for ln in out.splitlines() if ln.startswith('{"rank"')]
    return json.loads(line), out


def test_zero3_universal_load_shares_one_step_and_the_entry_gives_each_its_own(tmp_path):
    """Unfixed, the pinned DeepSpeed's ZeRO-3 universal load advances both groups' shared step
    twice per step (3 -> 7 in 2 steps); with the entry's snippet each group has its own step,
    3 after the load and 5 after 2 steps, and rank 0 says what it did."""
    require_trainer()
    ck = _saved_and_converted(tmp_path, "3")
    bug, _ = _loaded(tmp_path, ck, "3", fix=False)
    assert bug["after_load"] == [3, 3] and bug["after_2_steps"] == [7, 7], bug
    fixed, out = _loaded(tmp_path, ck, "3", fix=True)
    assert fixed["after_load"] == [3, 3] and fixed["after_2_steps"] == [5, 5], fixed
    assert (f"mlaunch: universal load of {ck}/global_step3_universal (global step 3): "
            "DeepSpeedZeroOptimizer_Stage3 optimizer step [3] in 2 states; 1 shared one step "
            "tensor and got their own") in out, out[-3000:]


@pytest.mark.parametrize("stage", ["1", "2o"])
def test_zero1_and_zero2_offload_universal_loads_keep_their_steps_and_the_fix_changes_nothing(
        tmp_path, stage):
    """ZeRO-1 (torch AdamW) and ZeRO-2 with the optimizer offloaded to the CPU (DeepSpeedCPUAdam):
    DeepSpeed's loader gives each group its own step; the snippet finds nothing shared."""
    require_trainer()
    ck = _saved_and_converted(tmp_path, stage)
    got, out = _loaded(tmp_path, ck, stage, fix=True)
    assert got["after_load"] == [3, 3] and got["after_2_steps"] == [5, 5], got
    assert "in 2 states; 0 shared one step tensor" in out, out[-3000:]

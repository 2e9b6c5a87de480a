"""Batch planning end to end: a real LLaMA-Factory run on CPU with the batch left to mlaunch,
and a refusal that starts nothing."""
from __future__ import annotations

import getpass
import glob
import os
import re

import pytest

from .training import build_tiny, lf_spec, require_trainer, submit_timed, trainer_state

pytestmark = [pytest.mark.training]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    require_trainer()
    return build_tiny(str(tmp_path_factory.mktemp("tiny")))


def test_auto_batch_trains_with_the_chosen_numbers(tmp_path, tiny):
    out = str(tmp_path / "out")
    spec = lf_spec(tiny, ["localhost"], 2, out, max_steps=3, save_steps=100)
    spec["batch"] = {"global": 8}
    del spec["training"]["gradient_checkpointing"]
    spec["cluster"]["gpu_memory_gb"] = 2
    r = submit_timed(tmp_path, spec)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    m = re.search(r"batch: per_device (\d+) × grad_accum (\d+), gradient checkpointing (on|off) "
                  r"\(chosen by mlaunch: per_device, grad_accum, gradient_checkpointing\)", r.stdout)
    assert m, r.stdout[-3000:]
    per_device, accum = int(m[1]), int(m[2])
    assert per_device * accum * 2 == 8 and (per_device, m[3]) == (4, "off")  # tiny model: all fits
    assert "GPU memory: 2.0 GiB (cluster.gpu_memory_gb)" in r.stdout
    state = trainer_state(out)
    assert state["global_step"] == 3 and state["train_batch_size"] == per_device
    (yaml_path,) = glob.glob(os.path.join(f"/tmp/mlaunch-{getpass.getuser()}/.mlaunch", os.path.basename(
        re.search(r"logs: (\S+)", r.stdout)[1]), "llamafactory.yaml"))
    text = open(yaml_path).read()
    assert f"per_device_train_batch_size: {per_device}\n" in text and "disable_gradient_checkpointing: true\n" in text


def test_unfit_explicit_batch_starts_nothing(tmp_path, tiny):
    out = str(tmp_path / "out")
    spec = lf_spec(tiny, ["localhost"], 1, out)
    spec["cluster"]["gpu_memory_gb"] = 1
    r = submit_timed(tmp_path, spec)
    assert r.returncode == 2
    assert re.fullmatch(r"mlaunch: batch: estimated [\d.]+ GiB per GPU of 1\.0 \(0\.9 usable\) with per_device 2, "
                        r"gradient checkpointing off: use deepspeed stage 3 .*, a shorter cutoff_len \(or --force-unfit\)",
                        r.stderr.splitlines()[-1]), r.stderr
    assert not os.path.exists(out)      # no log dir, no lock, no run: refused before the launch

"""Real LLaMA-Factory runs beyond SFT through `mlaunch submit`: DPO with LoRA on a synthetic
preference dataset, and report_to tensorboard, on 2 namespace hosts x 1 process (CPU, gloo).
Plus preflight's input and tracker checks on this machine.
"""
from __future__ import annotations

import copy
import glob
import json
import math
import os
import shutil

import pytest

from .helpers import preflight
from .training import (SWIFT_VENV, TRAINER_PYTHON, build_tiny, lf_spec, require_trainer, submit_timed,
                       trainer_state)

pytestmark = [pytest.mark.training]
SWIFT_SITE = glob.glob(os.path.join(SWIFT_VENV, "lib", "python3*", "site-packages"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    require_trainer()
    return build_tiny(str(tmp_path_factory.mktemp("tiny")))


def preference_data(tiny: dict, dest) -> str:
    """tiny_alpaca plus `tiny_pref`: each answer chosen over the same words reversed (LLaMA-Factory's
    alpaca ranking format), and `tiny_kto` without its tag column; returns the dataset_dir."""
    data = dest / "data"
    shutil.copytree(tiny["dataset_dir"], data)
    rows = json.load(open(data / f"{tiny['dataset']}.json"))
    pref = [{"instruction": r["instruction"], "input": r["input"], "chosen": r["output"],
             "rejected": " ".join(reversed(r["output"].split()))} for r in rows]
    (data / "tiny_pref.json").write_text(json.dumps(pref))
    info = json.load(open(data / "dataset_info.json"))
    info["tiny_pref"] = {"file_name": "tiny_pref.json", "ranking": True, "formatting": "alpaca",
                         "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen",
                                     "rejected": "rejected"}}
    info["tiny_kto"] = {"file_name": f"{tiny['dataset']}.json", "formatting": "alpaca"}
    (data / "dataset_info.json").write_text(json.dumps(info))
    return str(data)


def tensorboard_overlay(tmp_path) -> str:
    """tensorboard (and absl) from the ms-swift venv on the trainer venv's path: the trainer venv
    has no tensorboard, and transformers' TensorBoardCallback needs it."""
    if not SWIFT_SITE:
        pytest.skip(f"no ms-swift venv at {SWIFT_VENV} to borrow tensorboard from "
                    "(bash tests/env/make_swift_venv.sh .venvs/swift)")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    for pattern in ("tensorboard", "tensorboard-*.dist-info", "tensorboard_data_server*", "absl", "absl_py-*"):
        for path in glob.glob(os.path.join(SWIFT_SITE[0], pattern)):
            (overlay / os.path.basename(path)).symlink_to(path)
    return str(overlay)


@pytest.mark.multihost
def test_dpo_lora_trains_on_two_hosts_and_tensorboard_comes_from_node0_only(make_hostset, tmp_path, tiny):
    """DPO with LoRA and report_to tensorboard in one run (one trainer run fewer than apart)."""
    out = str(tmp_path / "out")
    data = preference_data(tiny, tmp_path)
    with make_hostset(2) as hs:
        spec = lf_spec(tiny, [h.ip for h in hs.hosts], 1, out, hs=hs, max_steps=4, save_steps=4,
                       stage="dpo", preference={"beta": 0.1, "loss": "sigmoid"},
                       report_to="tensorboard", name="tb")
        spec.update(dataset="tiny_pref", dataset_dir=data)
        spec["cluster"]["env"]["PYTHONPATH"] = tensorboard_overlay(tmp_path)
        spec["preflight"] = {"min_free_gb": 0, "min_shm_mb": 0}
        r = submit_timed(tmp_path, spec, preflight=True)   # preflight checks the ranking data form
        names = [h.name for h in hs.hosts]
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    state = trainer_state(out)
    assert state["global_step"] == 4
    logs = [e for e in state["log_history"] if "loss" in e]
    assert [e["step"] for e in logs] == [1, 2, 3, 4]
    for e in logs:   # DPO's own metrics, every step, all finite
        for key in ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins"):
            assert math.isfinite(e[key]), (key, e)
    assert "'rewards/margins'" in r.stdout or "rewards/margins" in r.stdout
    assert os.path.isfile(os.path.join(out, "adapter_model.safetensors"))
    # All nodes share this filesystem; transformers names the run dir and each event file after
    # the writer's hostname (runs/<time>_<host>/events.out.tfevents.<t>.<host>.<pid>.<n>).
    events = glob.glob(os.path.join(out, "runs", "*", "events.out.tfevents.*"))
    assert events, os.listdir(out)
    assert all(f".{names[0]}." in os.path.basename(e) and e.split(os.sep)[-2].endswith(f"_{names[0]}")
               for e in events), (events, names)
    assert not any(names[1] in e for e in events)
    blob = b"".join(open(e, "rb").read() for e in events)
    assert b"train/loss" in blob and b"tb-" in blob   # the scalars, and the run id as run_name


def test_preflight_checks_data_forms_model_paths_and_tracker(tmp_path, tiny):
    data = preference_data(tiny, tmp_path)
    spec = lf_spec(tiny, ["localhost"], 1, str(tmp_path / "out"), stage="dpo", report_to="tensorboard")
    spec.update(dataset=tiny["dataset"], dataset_dir=data,
                preflight={"min_free_gb": 0, "min_shm_mb": 0})
    # Where dataset_info.json is readable here, validate makes the same check (the same function)
    from launcher.errors import SpecError
    from launcher.spec.load import validate
    with pytest.raises(SpecError) as refused:
        validate(copy.deepcopy(spec))
    assert f"dataset: {tiny['dataset']}: stage dpo needs a preference dataset" in str(refused.value)
    # A dataset_dir relative to the node's workdir is read on the node only: preflight's check
    spec["cluster"]["workdir"] = os.path.dirname(data)
    spec["dataset_dir"] = os.path.basename(data)
    report = preflight(spec)
    row = report.get("storage/inputs", 0)
    assert row.status == "fail" and row.detail == (f"dataset: {tiny['dataset']}: stage dpo needs a preference "
                                                   "dataset (ranking: true, with chosen/rejected)"), row
    row = report.get("software/python", 0)
    assert row.status == "fail" and row.detail == ("report_to tensorboard: tensorboard is not installed "
                                                   "(the run would stop at start)"), row
    assert row.fix == f"{TRAINER_PYTHON} -m pip install tensorboard, or set report_to: none"

    spec.update(stage="sft", dataset="tiny_pref", report_to="none")
    row = preflight(spec).get("storage/inputs", 0)
    assert row.detail == "dataset: tiny_pref: a ranking dataset (ranking: true) cannot train stage sft; use dpo or rm"
    spec.update(stage="kto", dataset="tiny_kto")
    row = preflight(spec).get("storage/inputs", 0)
    assert row.detail.startswith("dataset: tiny_kto: stage kto needs a kto_tag column"), row

    spec.update(stage="sft", dataset=tiny["dataset"], dataset_dir="REMOTE:llamafactory/demo_data",
                model="models/nothere/tiny")
    spec["cluster"]["workdir"] = str(tmp_path)
    row = preflight(spec).get("storage/inputs", 0)
    assert row.status == "fail" and row.detail == (f"model: {tmp_path}/models/nothere/tiny: no such directory "
                                                   f"(relative to {tmp_path}), and not a hub id (those are org/name)")
    spec["model"] = "org/tiny-model"
    spec["cluster"]["env"].pop("HF_HUB_OFFLINE")
    row = preflight(spec).get("storage/inputs", 0)
    assert row.status == "pass", row
    assert (f"org/tiny-model is not a local path (no {tmp_path}/org/tiny-model here): a hub id, fetched at start"
            in row.detail and "dataset_dir REMOTE:llamafactory/demo_data is fetched from the hub at start" in row.detail)
    spec["cluster"]["env"]["HF_HUB_OFFLINE"] = "1"
    row = preflight(spec).get("storage/inputs", 0)
    assert row.status == "fail" and "HF_HUB_OFFLINE=1 forbids fetching it as a hub id" in row.detail

"""The plan a run records is the plan its dry-run printed: `mlaunch submit JOB --run-id R`
(preflight on) records attempt 0's plan in the registry, and it equals the JSON of
`mlaunch submit JOB --run-id R --dry-run --json` of the same spec but for the keys that
dry-run lists in `preflight_decides`; the run's own plan column is its last attempt's."""
from __future__ import annotations

import copy
import json
import os
import sys

import pytest

from launcher.record.registry import Registry

from .helpers import script_job, write_spec
from .runs import Runs


@pytest.fixture
def runs(tmp_path) -> Runs:
    return Runs(str(tmp_path / "home"))


def _dry_and_run(runs: Runs, spec_path: str, run_id: str, *flags: str) -> tuple[dict, object, list]:
    """(the dry-run's JSON, the registered run, its attempts) of one spec and run id."""
    d = runs.cli("submit", spec_path, "--run-id", run_id, "--dry-run", "--json", *flags)
    assert d.returncode == 0, d.stdout + d.stderr
    dry = json.loads(d.stdout)
    r = runs.cli("submit", spec_path, "--run-id", run_id, *flags, timeout=240)   # preflight on
    assert r.returncode == 0, r.stdout + r.stderr
    assert "preflight: checking" in r.stdout, r.stdout
    reg = Registry(os.path.join(runs.home, "runs.db"))
    try:
        return dry, reg.get(run_id), reg.attempts(run_id)
    finally:
        reg.close()


def _without(plan: dict, keys: list[str]) -> dict:
    """plan less the keys (dotted: "nodes.argv" is every node's argv) and preflight_decides."""
    out = copy.deepcopy(plan)
    out.pop("preflight_decides")
    for key in keys:
        head, _, leaf = key.partition(".")
        if leaf:
            for item in out[head]:
                item.pop(leaf)
        else:
            out.pop(head)
    return out


@pytest.mark.launches
def test_a_localhost_run_records_exactly_its_dry_run_plan(tmp_path, runs):
    """Two nodes on localhost, nothing for preflight to decide: the recorded plan is the
    dry-run's JSON, field for field."""
    shared = tmp_path / "shared"
    shared.mkdir()
    spec = script_job(["localhost", "localhost"], 1, "fail_or_sleep.py", ["-1", "0", "0"],
                      str(tmp_path / "out"), cuda_visible_devices=[[0], [1]], shared_dir=str(shared))
    script = tmp_path / "hello.py"
    script.write_text("import os\nprint('hello rank', os.environ['RANK'], flush=True)\n")
    spec["script"]["path"] = str(script)
    dry, run, attempts = _dry_and_run(runs, write_spec(tmp_path, spec), "R", "--max-restarts", "2")

    assert dry["restarts"]["max_restarts"] == 2   # the flag's policy, recorded as the dry run shows it
    assert dry["preflight_decides"] == [] and len(dry["nodes"]) == 2
    assert [(a.n, a.tag, a.state) for a in attempts] == [(0, "R", "succeeded")]
    assert attempts[0].plan == dry
    assert run.plan == attempts[-1].plan
    assert run.state == "succeeded" and run.backend == "local"


def _llamafactory_standin(folder) -> str:
    """A package `llamafactory` 0.9.1 (installed as far as importlib.metadata can tell) whose
    launcher module prints the batch numbers of the YAML mlaunch rendered for it and exits 0:
    its folder, for cluster.env.PYTHONPATH."""
    pkg = folder / "pkg"
    (pkg / "llamafactory").mkdir(parents=True)
    (pkg / "llamafactory" / "__init__.py").write_text('__version__ = "0.9.1"\n')
    (pkg / "llamafactory" / "launcher.py").write_text(
        "import sys, yaml\n"
        "args = yaml.safe_load(open(sys.argv[1]))\n"
        "print(f\"lf-standin per_device {args['per_device_train_batch_size']} accum "
        "{args['gradient_accumulation_steps']}\", flush=True)\n")
    (pkg / "llamafactory-0.9.1.dist-info").mkdir()
    (pkg / "llamafactory-0.9.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: llamafactory\nVersion: 0.9.1\n")
    return str(pkg)


@pytest.mark.launches
def test_what_preflight_decides_is_the_only_difference(tmp_path, runs):
    """A `trainer: script` job has no batch for mlaunch to pick (batch.resolve is None for it),
    so its preflight_decides is always empty: this case is a llamafactory job (a stand-in
    package on one localhost node) whose batch.global alone is given. The dry-run lists
    batch, nodes.argv and files as preflight's to decide; the recorded plan equals it without
    those keys, holds the batch as decided (nothing left to choose) and lists none."""
    (tmp_path / "model").mkdir()
    data = tmp_path / "data"
    data.mkdir()
    (data / "dataset_info.json").write_text(json.dumps({"d": {"file_name": "d.json"}}))
    (data / "d.json").write_text("[]")
    (tmp_path / "shared").mkdir()   # the run dir (and its pidfiles) of this test's own
    spec = {"name": "t", "trainer": "llamafactory",
            "cluster": {"hosts": ["localhost"], "gpus_per_node": 1, "python": sys.executable,
                        "shared_dir": str(tmp_path / "shared"),
                        "env": {"PYTHONPATH": _llamafactory_standin(tmp_path)}},
            "model": str(tmp_path / "model"), "template": "qwen", "dataset": "d",
            "dataset_dir": str(data), "finetuning": {"type": "lora"}, "batch": {"global": 4},
            "training": {"max_steps": 1, "learning_rate": 1.0e-4},
            "output_dir": str(tmp_path / "out")}
    dry, run, attempts = _dry_and_run(runs, write_spec(tmp_path, spec), "R")

    assert dry["preflight_decides"] == ["batch", "nodes.argv", "files"]
    assert dry["batch"]["chosen"], dry["batch"]   # mlaunch picks the batch: preflight may change it
    assert [(a.n, a.state) for a in attempts] == [(0, "succeeded")]
    recorded = attempts[0].plan
    assert _without(recorded, dry["preflight_decides"]) == _without(dry, dry["preflight_decides"])
    assert recorded["preflight_decides"] == [] and recorded["batch"]["chosen"] == []
    b = recorded["batch"]
    log = open(recorded["nodes"][0]["log"]).read()
    assert f"lf-standin per_device {b['per_device']} accum {b['grad_accum']}" in log, log
    assert run.plan == attempts[-1].plan

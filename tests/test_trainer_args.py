"""Rendered trainer arguments are ones the installed trainer accepts, on transformers 4 and 5.

transformers 5 dropped warmup_ratio (a float warmup_steps below 1 is a ratio there), so the
LLaMA-Factory YAML depends on the nodes' transformers version, which preflight probes.
The real checks hand the rendered YAML to LLaMA-Factory's own argument parser: in the
trainer venv (transformers 4.57) and over the ms-swift venv's transformers 5.19.
"""
from __future__ import annotations

import functools
import getpass
import json
import math
import os
import re
import subprocess

import pytest
import yaml

from launcher.plan.launch_plan import build_plan
from launcher.spec import validate
from launcher.plan.trainers import warmup_arg

from .loadfactor import limit
from .helpers import CONFIGS, preflight
from .training import SWIFT_PYTHON, TRAINER_PYTHON, require_swift, require_trainer

pytestmark = pytest.mark.training

PARSE = """
import json, sys, transformers, yaml
from llamafactory.hparams import get_train_args
_, _, args, _, _ = get_train_args(yaml.safe_load(open(sys.argv[1])))
print("MLAUNCH-ARGS " + json.dumps({"transformers": transformers.__version__,
                                    "warmup_of_200": args.get_warmup_steps(200)}))
"""


def quickstart(training: dict, out_dir: str) -> dict:
    spec = yaml.safe_load(open(os.path.join(CONFIGS, "quickstart.yaml")))
    spec.update(training={"learning_rate": 1e-3, **training}, precision="fp32", output_dir=out_dir)
    return spec


def rendered_yaml(spec: dict, transformers: str | None) -> str:
    plan = build_plan(validate(spec), run_id="r", transformers=transformers)
    return next(f.content for f in plan.files if f.path.endswith("llamafactory.yaml"))


@functools.lru_cache(maxsize=None)   # an interpreter start each: asked 6 times per worker
def site_packages(python: str) -> str:
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def parse(tmp_path, text: str, five: bool) -> subprocess.CompletedProcess:
    """LLaMA-Factory's parser on text; five: over transformers 5 (the swift venv's)."""
    path = tmp_path / "lf.yaml"
    path.write_text(text)
    env = dict(os.environ)
    python = require_trainer()
    if five:
        python = require_swift()
        # The swift venv's transformers 5 first, LLaMA-Factory and the rest from the trainer venv.
        env["PYTHONPATH"] = f"{site_packages(SWIFT_PYTHON)}:{site_packages(TRAINER_PYTHON)}"
        env["DISABLE_VERSION_CHECK"] = "1"   # LLaMA-Factory 0.9.5 officially stops at 4.57
    return subprocess.run([python, "-c", PARSE, str(path)], capture_output=True, text=True,
                          env=env, timeout=limit(180))


def parsed(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("MLAUNCH-ARGS "))
    return json.loads(line.split(" ", 1)[1])


@functools.lru_cache(maxsize=None)   # a transformers import each (about 4 CPU s)
def installed_transformers(python: str) -> str:
    out = subprocess.run([python, "-c", "import transformers; print(transformers.__version__)"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize("training,version,key,value", [
    ({"warmup_steps": 7, "max_steps": 30}, "5.19.0", "warmup_steps", 7),
    ({"warmup_ratio": 0.1, "max_steps": 30}, None, "warmup_steps", 3),
    ({"warmup_ratio": 0.1, "epochs": 1}, "4.57.6", "warmup_ratio", 0.1),
    ({"warmup_ratio": 0.1, "epochs": 1}, None, "warmup_ratio", 0.1),
    ({"warmup_ratio": 0.1, "epochs": 1}, "5.19.0", "warmup_steps", 0.1),
    # TrainingArguments declares warmup_ratio through 5.14.x and not from 5.15.0 on
    # (checked in the released wheels of 5.0.0, 5.6.0, 5.12.0, 5.13.0, 5.14.0/1, 5.15.0-5.18.0).
    ({"warmup_ratio": 0.1, "epochs": 1}, "5.14.1", "warmup_ratio", 0.1),
    ({"warmup_ratio": 0.1, "epochs": 1}, "5.6.0", "warmup_ratio", 0.1),
    ({"warmup_ratio": 0.1, "epochs": 1}, "5.15.0", "warmup_steps", 0.1),
])
def test_warmup_key_per_version(training, version, key, value):
    tr = validate(quickstart(training, "/tmp/x")).training
    w = warmup_arg(tr, version)
    assert (w.key, w.value) == (key, value)


@pytest.mark.parametrize("five", [False, True], ids=["transformers4", "transformers5"])
@pytest.mark.parametrize("training", [{"warmup_ratio": 0.1, "epochs": 1},
                                      {"warmup_ratio": 0.1, "max_steps": 30}], ids=["epochs", "max_steps"])
def test_llamafactory_accepts_the_rendered_yaml(tmp_path, five, training):
    version = installed_transformers(SWIFT_PYTHON if five else require_trainer())
    assert version.startswith("5." if five else "4.")
    text = rendered_yaml(quickstart(training, str(tmp_path / "out")), version)
    got = parsed(parse(tmp_path, text, five))
    assert got["transformers"] == version
    # Same warmup on either version: 10% of 200 steps, or 10% of max_steps 30 rounded up.
    assert got["warmup_of_200"] == (20 if "epochs" in training else 3)


def test_unprobed_ratio_fails_loudly_on_transformers5(tmp_path):
    """What the renderer avoids: transformers 5.15+ rejects warmup_ratio (the device run's error)."""
    text = rendered_yaml(quickstart({"warmup_ratio": 0.1, "epochs": 1}, str(tmp_path / "out")), None)
    assert "warmup_ratio: 0.1" in text and "transformers up to 5.14 accept warmup_ratio, 5.15 and later reject it" in text
    r = parse(tmp_path, text, five=True)
    assert r.returncode != 0 and "Some keys are not used by the HfArgumentParser: ['warmup_ratio']" in r.stderr


def test_preflight_reports_the_transformers_version(tmp_path):
    """submit renders from what the nodes run: the fast preflight brings the version back."""
    spec = quickstart({"warmup_ratio": 0.1, "epochs": 1}, str(tmp_path / "out"))
    spec["cluster"]["python"] = require_trainer()
    spec["preflight"] = {"min_free_gb": 0, "min_shm_mb": 0}
    report = preflight(spec)
    assert report.stack["transformers"] == installed_transformers(TRAINER_PYTHON)
    row = report.get("software/versions", 0)
    assert row.status == "pass" and f"transformers {report.stack['transformers']}" in row.detail


def test_submit_trains_on_transformers5_with_a_warmup_ratio(tmp_path):
    """End to end: `mlaunch submit` probes the nodes' transformers (5.19 here), renders
    warmup_steps: 0.1 instead of warmup_ratio, and LLaMA-Factory trains with that warmup.

    LLaMA-Factory 0.9.5 runs over the ms-swift venv's transformers 5; trl 0.24 comes from the
    trainer venv (trl 0.29 dropped a class LLaMA-Factory imports), as on the GPU machine.
    """
    from .training import build_tiny, lf_spec, submit_timed, trainer_state
    trainer_site, swift_site = site_packages(require_trainer()), site_packages(require_swift())
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "trl").symlink_to(os.path.join(trainer_site, "trl"))
    tiny = build_tiny(str(tmp_path / "tiny"))
    out = str(tmp_path / "out")
    spec = lf_spec(tiny, ["localhost"], 2, out, name="transformers5")
    spec["training"] = {"learning_rate": 1.0e-3, "epochs": 1, "warmup_ratio": 0.1,
                        "save_steps": 1000, "logging_steps": 1, "gradient_checkpointing": False}
    spec["cluster"]["python"] = SWIFT_PYTHON
    spec["cluster"]["env"].update(PYTHONPATH=f"{overlay}:{swift_site}:{trainer_site}",
                                  DISABLE_VERSION_CHECK="1")
    spec["preflight"] = {"min_free_gb": 0, "min_shm_mb": 0}
    r = submit_timed(tmp_path, spec, preflight=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    run_id = re.search(r"run (transformers5-\S+):", r.stdout).group(1)
    rendered = open(f"/tmp/mlaunch-{getpass.getuser()}/.mlaunch/{run_id}/llamafactory.yaml").read()
    assert "warmup_steps: 0.1\n" in rendered and "\nwarmup_ratio:" not in rendered
    assert (f"# transformers {installed_transformers(SWIFT_PYTHON)} has no warmup_ratio (removed in 5.15); "
            "it reads a warmup_steps below 1 as a ratio") in rendered
    state = trainer_state(out)
    steps = state["global_step"]
    lrs = [e["learning_rate"] for e in state["log_history"] if "learning_rate" in e]
    assert steps == state["max_steps"] and len(lrs) == steps
    # ceil(10% of the steps) of linear warmup from 0 to the peak: the ratio took effect
    # (without it, step 1 would already run at 1e-3).
    warm = math.ceil(0.1 * steps)
    assert lrs[:warm + 1] == pytest.approx([1.0e-3 * k / warm for k in range(warm + 1)]), lrs

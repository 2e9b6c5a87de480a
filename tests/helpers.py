"""Small shared helpers for the test suite (no fixtures here; see conftest.py)."""
from __future__ import annotations

import copy
import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")
SEED000 = os.path.join(CONFIGS, "seed000-qwen2-7b-lora.yaml")


def load_yaml(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def seed000() -> dict:
    """A fresh, mutable copy of seed 000's spec."""
    return copy.deepcopy(load_yaml(SEED000))


def write_spec(tmp_path, data: dict, name: str = "job.yaml") -> str:
    path = os.path.join(str(tmp_path), name)
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)
    return path


def mlaunch(*args: str, cwd: str | None = None, env: dict | None = None, timeout: float = 120,
            **kw) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("MLAUNCH_DEBUG", None) if not (env and "MLAUNCH_DEBUG" in env) else None
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd or ROOT,
                          env=full_env, capture_output=True, text=True, timeout=timeout, **kw)

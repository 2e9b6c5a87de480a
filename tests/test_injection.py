"""Hostile values render quoted: running the real node script injects nothing.

The node script runs exactly as the local executor runs it (/bin/sh -c), with a fake
torchrun beside the spec's python that records the argv and environment it received.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest
import yaml

from launcher.plan.launch_plan import build_plan
from launcher.errors import SpecError
from launcher.spec import validate

from .loadfactor import limit
from .helpers import seed000

FAKE_TORCHRUN = """#!/bin/sh
exec {python} -c 'import json, os, sys; json.dump({{"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}}, open(os.environ["RECORD"], "w"))' "$@"
"""


def hostile(canary_dir: str) -> list[str]:
    c = canary_dir
    return [f"; touch {c}/semicolon", f"$(touch {c}/dollar)", f"`touch {c}/backtick`",
            f"&& touch {c}/and", f"| touch {c}/pipe", "it's \"quoted\"", "$HOME", "* ?[a]",
            f"> {c}/redirect", "-rf ~"]


def make_job(tmp_path, canary: str) -> tuple[dict, list[str]]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    import sys
    (bindir / "torchrun").write_text(FAKE_TORCHRUN.format(python=sys.executable))
    (bindir / "torchrun").chmod(stat.S_IRWXU)
    values = hostile(canary)
    workdir = tmp_path / f"work dir $(touch {canary}/workdir)"
    os.makedirs(workdir)
    job = {"name": "inject", "trainer": "script",
           "cluster": {"hosts": ["localhost"], "gpus_per_node": 1, "python": str(bindir / "python"),
                       "workdir": str(workdir),
                       # `$$` is a literal `$` (a bare `$(` is refused: test below)
                       "env": {"RECORD": str(tmp_path / "record.json"),
                               "EVIL": values[1].replace("$", "$$") + values[0]}},
           "script": {"path": "/opt/train.py; touch " + canary + "/path", "args": values}}
    return job, values


def test_hostile_values_do_not_run(tmp_path):
    canary = tmp_path / "canary"
    canary.mkdir()
    data, values = make_job(tmp_path, str(canary))
    plan = build_plan(validate(data), run_id="inject")
    node = plan.nodes[0]
    # stdin stays open as the launcher keeps it: closing it would trigger the hang-up guard.
    proc = subprocess.Popen(["/bin/sh", "-c", node.script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = proc.stdout.read()
    assert proc.wait(timeout=limit(60)) == 0, output
    proc.stdin.close()
    assert os.listdir(canary) == [], "an injected command ran"
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["argv"] == list(node.argv[1:])
    assert record["argv"][-len(values):] == values
    assert record["argv"][-len(values) - 1] == data["script"]["path"]
    assert record["env"]["EVIL"] == values[1] + values[0]
    assert record["cwd"] == data["cluster"]["workdir"]


def test_model_path_is_quoted_in_yaml_and_dry_run():
    data = seed000()
    data["model"] = "/data/x; rm -rf ~"
    data["dataset_dir"] = "/data/$(reboot)"
    plan = build_plan(validate(data), run_id="q")
    lf = next(f.content for f in plan.files if f.path.endswith(".yaml"))
    parsed = yaml.safe_load(lf)
    assert parsed["model_name_or_path"] == "/data/x; rm -rf ~"
    assert parsed["dataset_dir"] == "/data/$(reboot)"


def test_hostile_shared_dir_quoted(tmp_path):
    data = seed000()
    data["cluster"]["shared_dir"] = "/mnt/a b/$(id)"
    plan = build_plan(validate(data), run_id="q")
    script = plan.nodes[0].script
    assert "mkdir -p -- '/mnt/a b/$(id)' || exit 96" in script
    assert "s='/mnt/a b/$(id)/.mlaunch'\n" in script
    assert "for d in '/mnt/a b/$(id)/.mlaunch/train' '/mnt/a b/$(id)/.mlaunch/train/q'; do" in script


def test_a_command_substitution_in_an_env_value_is_refused(tmp_path):
    data, _ = make_job(tmp_path, str(tmp_path / "canary"))
    data["cluster"]["env"]["EVIL"] = "$(touch /tmp/x)"
    with pytest.raises(SpecError) as e:
        validate(data)
    assert ("cluster.env.EVIL: '$(': only $NAME and ${NAME} are expanded (from each node's "
            "environment); write $$ for a literal $") in "\n".join(e.value.lines())

"""ms-swift's own examples as the acceptance corpus (configs/swift-examples/).

Each spec there expresses one launch script of ms-swift's examples/train and
examples/megatron (transcribed into examples.json by tools/swift_example_argv.py, which
names the commit). Both argument lists, the example's and mlaunch's rendering of the spec,
go through ms-swift 4.6's own HfArgumentParser for the entry point (tools/swift_args.py, in
the swift venv), and every argument's effective value is compared. The arguments that
differ must be exactly the rows of configs/swift-examples/DIFFERENCES.md, with the values
shown there: a difference nobody wrote down fails, and so does a row that no longer differs.
"""
from __future__ import annotations

import glob
import json
import os
import re
import subprocess

import pytest

from launcher.spec import load_spec
from launcher.plan.trainers import TRAINERS, RunContext

from .loadfactor import limit
from .helpers import ROOT
from .training import require_swift

CORPUS = os.path.join(ROOT, "configs", "swift-examples")
RUN = RunContext(run_id="EX", run_dir="/data/work/.mlaunch/EX")


def examples() -> dict:
    with open(os.path.join(CORPUS, "examples.json"), encoding="utf-8") as fh:
        return json.load(fh)


def rendered(name: str) -> tuple[str, list[str]]:
    """(entry, argv) mlaunch renders for configs/swift-examples/<name>.yaml."""
    args = TRAINERS["swift"].entry(load_spec(os.path.join(CORPUS, f"{name}.yaml")), RUN)
    module = args[1]
    entry = ("megatron." if "._megatron." in module else "swift.") + module.rsplit(".", 1)[1]
    return entry, args[2:]


def differences_table() -> dict[str, dict[str, tuple[str, str]]]:
    """example -> argument -> (example's value, mlaunch's value), as DIFFERENCES.md lists them."""
    rows: dict[str, dict[str, tuple[str, str]]] = {}
    with open(os.path.join(CORPUS, "DIFFERENCES.md"), encoding="utf-8") as fh:
        for line in fh:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 5 and cells[0].startswith("`") and cells[1].startswith("`"):
                name, arg, ex, ml = (re.sub(r"^`|`$", "", c) for c in cells[:4])
                rows.setdefault(name, {})[arg] = (ex, ml)
    return rows


def parse_all(jobs: list) -> list[dict]:
    """Every (entry, argv) through ms-swift's own parser, in one swift-venv process."""
    python = require_swift()
    out = subprocess.run([python, os.path.join(ROOT, "tools", "swift_args.py")],
                         input=json.dumps({"jobs": jobs}), capture_output=True, text=True,
                         timeout=limit(600), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def show(value) -> str:
    return json.dumps(value, ensure_ascii=False)


@pytest.fixture(scope="module")
def parsed():
    ex = examples()
    names = sorted(ex)
    jobs = []
    for name in names:
        jobs.append([ex[name]["entry"], ex[name]["argv"]])
        jobs.append(list(rendered(name)))
    results = parse_all(jobs)
    return {name: (results[2 * i], results[2 * i + 1]) for i, name in enumerate(names)}


def test_every_spec_has_its_example():
    specs = {os.path.basename(p)[:-5] for p in glob.glob(os.path.join(CORPUS, "*.yaml"))}
    assert specs == set(examples()) and len(specs) >= 15


@pytest.mark.parametrize("name", sorted(examples()))
def test_same_entry_point(name):
    assert rendered(name)[0] == examples()[name]["entry"]


@pytest.mark.parametrize("name", sorted(examples()))
@pytest.mark.training
def test_effective_arguments_equal_the_examples(parsed, name):
    theirs, ours = parsed[name]
    assert "error" not in theirs, theirs
    assert "error" not in ours, ours
    a, b = theirs["args"], ours["args"]
    got = {k: (show(a.get(k)), show(b.get(k))) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
    assert got == differences_table().get(name, {})

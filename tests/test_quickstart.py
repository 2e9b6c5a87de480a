"""Issue 56 item 2: ./quickstart.sh from a copy of the checkout, as a newcomer runs it.

It must install mlaunch into a virtualenv of its own (never into the interpreter first on
PATH), build only the trainer it needs, train, and end with a short summary: the final loss,
where the adapter and logs are, and the next three commands. Its whole output stays short
(the trainer's own lines go to .quickstart/submit.log).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from .helpers import ROOT
from .loadfactor import limit

pytestmark = [pytest.mark.training]


def _copy_checkout(dest: str) -> None:
    """The files a clone would have (tracked and new, not ignored): no .venvs, no .quickstart."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for raw in filter(None, names):
        name = raw.decode()
        src = os.path.join(ROOT, name)
        if not os.path.isfile(src):
            continue  # deleted in the work tree
        os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
        shutil.copy2(src, os.path.join(dest, name))


def test_quickstart_installs_into_its_own_venv_trains_and_ends_with_a_summary(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is needed to copy the checkout")
    work = tmp_path / "clone"
    _copy_checkout(str(work))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run(["./quickstart.sh"], cwd=work, env=env, capture_output=True, text=True,
                       timeout=limit(900))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    lines = out.splitlines()
    assert len(lines) <= 60, f"{len(lines)} lines:\n{out}"
    loss = re.search(r"final loss ([0-9.]+)$", out, re.M)
    assert loss and 0 < float(loss.group(1)) < 20, out
    assert (work / ".quickstart/output/adapter_model.safetensors").is_file()
    nxt = lines[lines.index("Next:") + 1:]
    assert [ln.split()[0] for ln in nxt[:3]] == ["source", "mlaunch", "mlaunch"], out
    # mlaunch was installed into the copy's own venv, and runs from the copy
    own = subprocess.run([str(work / ".venvs/mlaunch/bin/python"), "-c",
                          "import launcher, os; print(os.path.realpath(launcher.__file__))"],
                         capture_output=True, text=True, env=env, cwd="/")
    assert own.stdout.strip().startswith(os.path.realpath(work)), own
    # the trainer's own output is in the log, not on the console
    log = (work / ".quickstart/submit.log").read_text()
    assert "llamafactory" in log.lower() and len(log.splitlines()) > len(lines)

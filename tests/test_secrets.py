"""cluster.env secrets reach the ranks and nothing else: no command line, no file, no log."""
from __future__ import annotations

import glob
import hashlib
import os
import re
import secrets
import threading

import pytest

from .helpers import mlaunch, script_job, write_spec


class CmdlineSampler:
    """Reads every /proc/*/cmdline every 100 ms, in a thread, and keeps each hit."""

    def __init__(self, needle: str):
        self.needle = needle.encode()
        self.hits: list[tuple[int, bytes]] = []
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "CmdlineSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for path in glob.glob("/proc/[0-9]*/cmdline"):
                try:
                    with open(path, "rb") as fh:
                        text = fh.read()
                except OSError:
                    continue   # the process ended between listing and reading
                if self.needle in text:
                    self.hits.append((int(path.split("/")[2]), text))
            self.rounds += 1
            self._stop.wait(0.1)


def files_holding(root: str, needle: str, skip: set[str]) -> list[str]:
    """Every file under root whose bytes contain needle."""
    found = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            if path in skip or os.path.islink(path):
                continue
            with open(path, "rb") as fh:
                if needle.encode() in fh.read():
                    found.append(path)
    return found


def run_with_canary(tmp_path, hosts: list[str], nproc: int, hs=None) -> None:
    """A 2-rank job with a canary HF_TOKEN whose first attempt fails and is restarted."""
    canary = "hf_canary_" + secrets.token_hex(16)
    markers = tmp_path / "markers"
    markers.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    spec = script_job(hosts, nproc, "canary.py", [str(markers), "3"], str(tmp_path / "out"), hs=hs,
                      workdir=str(work), env={"HF_TOKEN": canary, "NCCL_DEBUG": "WARN"})
    spec.update(max_restarts=1, restart_backoff_s=1)
    path = write_spec(tmp_path, spec)
    with CmdlineSampler(canary) as sampler:
        rendered = mlaunch("render", path, "--out", str(tmp_path / "rendered"))
        dry = mlaunch("submit", path, "--dry-run")
        # The full checklist too: its probes and its all-reduce job carry cluster.env.
        checked = mlaunch("check", path, timeout=300)
        r = mlaunch("submit", path, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert rendered.returncode == 0 and dry.returncode == 0, rendered.stderr + dry.stderr
    assert re.search(r"attempt 0: exit 3", out) and "attempt 1: exit 0" in out, out[-3000:]
    # The ranks saw the secret, in both attempts.
    digest = hashlib.sha256(canary.encode()).hexdigest()
    assert len(re.findall(rf"HF_TOKEN sha256 {digest}", out)) == 2 * len(hosts) * nproc, out[-3000:]
    assert sampler.rounds > 10
    assert sampler.hits == [], f"secret on a command line: {sampler.hits[:3]}"
    assert canary not in out and canary not in dry.stdout
    assert checked.returncode in (0, 1) and "collective" in checked.stdout, checked.stdout + checked.stderr
    assert canary not in checked.stdout + checked.stderr
    # No file holds it: run directory (workdir/.mlaunch), logs, rendered output. Only the
    # user's own spec file does.
    assert glob.glob(str(work / ".mlaunch" / "*")), "no run directory was written"
    assert glob.glob(str(tmp_path / "out" / "logs" / "*" / "*.log"))
    assert files_holding(str(tmp_path), canary, skip={path}) == []


@pytest.mark.launches
def test_secret_never_on_a_command_line_local(tmp_path):
    run_with_canary(tmp_path, ["localhost"], 2)


@pytest.mark.multihost
def test_secret_never_on_a_command_line_ssh(make_hostset, tmp_path):
    with make_hostset(2) as hs:
        run_with_canary(tmp_path, [h.ip for h in hs.hosts], 1, hs=hs)

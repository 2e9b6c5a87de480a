"""Helpers for the tests of detached runs and the run registry: the real CLI, a private MLAUNCH_HOME."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

from .helpers import ROOT, limit, write_spec

CLI = [sys.executable, "-m", "launcher.cli"]


class Runs:
    """The mlaunch CLI against one private registry (MLAUNCH_HOME=<dir>)."""

    def __init__(self, home: str):
        self.home = home
        self.env = {**os.environ, "MLAUNCH_HOME": home}
        self.env.pop("MLAUNCH_DEBUG", None)

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([*CLI, *args], cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=limit(timeout))

    def popen(self, *args: str, **kw) -> subprocess.Popen:
        return subprocess.Popen([*CLI, *args], cwd=ROOT, env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)

    def detach(self, tmp_path, spec: dict, *args: str, name: str = "job.yaml") -> str:
        """submit -d; the run id."""
        r = self.cli("submit", "-d", write_spec(tmp_path, spec, name), "--no-preflight", *args)
        assert r.returncode == 0, r.stdout + r.stderr
        return run_id_of(r.stdout)

    def ps(self, all_: bool = True) -> list[dict]:
        r = self.cli("ps", "--json", *(["--all"] if all_ else []))
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def run(self, run_id: str) -> dict:
        return next(r for r in self.ps() if r["id"] == run_id)

    def wait_state(self, run_id: str, states: tuple[str, ...], timeout: float = 180) -> dict:
        deadline = time.monotonic() + limit(timeout)
        while True:
            row = self.run(run_id)
            if row["state"] in states or time.monotonic() > deadline:
                assert row["state"] in states, row
                return row
            time.sleep(0.3)

    def wait_console(self, run_id: str, pattern: str, count: int = 1, timeout: float = 120) -> str:
        """The console log once it holds pattern count times."""
        path = self.console_path(run_id)
        deadline = time.monotonic() + limit(timeout)
        while True:
            text = open(path).read() if os.path.exists(path) else ""
            if len(re.findall(pattern, text)) >= count or time.monotonic() > deadline:
                assert len(re.findall(pattern, text)) >= count, text[-3000:]
                return text
            time.sleep(0.2)

    def console_path(self, run_id: str) -> str:
        return os.path.join(self.home, "runs", run_id, "console.log")

    def attempts(self, run_id: str):
        from launcher.record.registry import Registry
        reg = Registry(os.path.join(self.home, "runs.db"))
        try:
            return reg.attempts(run_id)
        finally:
            reg.close()


def run_id_of(stdout: str) -> str:
    m = re.search(r"run (\S+) detached \(supervisor pid \d+\)", stdout)
    assert m, stdout
    return m.group(1)


def submit_in_terminal(runs: Runs, spec_path: str) -> tuple[subprocess.Popen, str]:
    """`submit -d` in a session and process group of its own, like a shell in a terminal that
    stays open afterwards; returns that group's leader and the run id.

    A terminal's shell takes SIGHUP's default action. The suite itself may run under `nohup`
    (SIGHUP ignored, and an ignored signal stays ignored through fork and exec, where bash
    cannot trap it back): the hang-up would then end nothing and prove nothing, so the
    shell's disposition is reset here."""
    shell = subprocess.Popen(
        ["bash", "-c", " ".join([*CLI, "submit", "-d", spec_path, "--no-preflight"]) +
         "; echo SUBMIT-RC=$?; exec sleep 600"],
        cwd=ROOT, env=runs.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=_sighup_default)
    out = []
    for line in shell.stdout:
        out.append(line)
        if line.startswith("SUBMIT-RC="):
            break
    text = "".join(out)
    assert "SUBMIT-RC=0" in text, text
    return shell, run_id_of(text)


def _sighup_default() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def hang_up(shell: subprocess.Popen) -> None:
    """What a closed terminal does: SIGHUP to the whole process group."""
    os.killpg(shell.pid, signal.SIGHUP)
    shell.wait(timeout=limit(30))

"""A second real Unix user for the isolation tests: the other user on a shared machine.

The suite runs as root; `other_user()` makes the user `mlaunch-other` once (useradd, no home,
no login shell needed) and returns it, or skips the test with the reason where it cannot
(not root, no useradd). Idempotent and safe under pytest-xdist: workers take a file lock
around the check and the useradd, so two never race to create it.
"""
from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass

import pytest

NAME = "mlaunch-other"
LOCK = "/tmp/mlaunch-test-users.lock"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int

    def run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        """argv as this user (no supplementary groups), its output captured as text."""
        return subprocess.run(["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                               *argv], capture_output=True, text=True, **kw)

    def plant(self, path: str, *, link_to: str | None = None, mode: int = 0o755) -> str:
        """A link to link_to at path, or a directory, made by this user (as the attacker would)."""
        argv = ["ln", "-s", "--", link_to, path] if link_to else ["mkdir", "-m", oct(mode)[2:], "--", path]
        r = self.run(argv, timeout=30)
        assert r.returncode == 0, r.stderr
        return path


def other_user() -> User:
    """The second user, made once per machine; skips where it cannot be made."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a second Unix user is made with useradd")
    if not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.skip("needs useradd and setpriv (util-linux) to act as a second Unix user")
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            pw = pwd.getpwnam(NAME)
        except KeyError:
            r = subprocess.run(["useradd", "--no-create-home", "--user-group", NAME],
                               capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                pytest.skip(f"useradd {NAME} failed: {r.stderr.strip()}")
            pw = pwd.getpwnam(NAME)
    return User(NAME, pw.pw_uid, pw.pw_gid)

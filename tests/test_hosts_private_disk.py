"""Test hosts that share no disk (make_hostset(..., private_disk=True)): a file one host writes
at the jobs' path is on that host alone, not on another host, not on the launcher's machine;
without the option every host still sees one filesystem."""
from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.multihost


def _ssh(hs, host, command: str):
    """command run on host through its sshd (as a job's session would), from this machine."""
    import subprocess
    return subprocess.run([*hs.ssh_argv(host), command], capture_output=True, text=True, timeout=60)


def test_a_file_written_on_one_host_is_on_that_host_alone(make_hostset):
    with make_hostset(2, private_disk=True) as hs:
        a, b = hs.hosts
        path = os.path.join(hs.disk, "models", "weights.bin")
        r = _ssh(hs, a, f"mkdir -p {os.path.dirname(path)} && echo on-a > {path} && cat {path}")
        assert r.returncode == 0 and r.stdout.strip() == "on-a", r.stderr
        assert _ssh(hs, b, f"test -e {path}").returncode == 1          # not on host B
        assert not os.path.exists(path)                                # not on the launcher
        with open(os.path.join(hs.disk_of(a), "models", "weights.bin")) as f:   # a's own disk
            assert f.read() == "on-a\n"
        # the launcher's file at the same path is its own, seen by no host
        with open(os.path.join(hs.disk, "launcher-only"), "w") as f:
            f.write("x")
        for h in hs.hosts:
            assert _ssh(hs, h, f"test -e {hs.disk}/launcher-only").returncode == 1
        # and what B writes there is B's
        assert _ssh(hs, b, f"echo on-b > {hs.disk}/b.txt").returncode == 0
        assert _ssh(hs, a, f"test -e {hs.disk}/b.txt").returncode == 1
        assert os.path.exists(os.path.join(hs.disk_of(b), "b.txt"))


def test_without_the_option_every_host_shares_one_disk(make_hostset):
    with make_hostset(2) as hs:
        assert hs.disk is None
        a, b = hs.hosts
        path = os.path.join(hs.dir, "shared.txt")
        assert _ssh(hs, a, f"echo shared > {path}").returncode == 0
        r = _ssh(hs, b, f"cat {path}")
        assert r.returncode == 0 and r.stdout.strip() == "shared"
        with open(path) as f:
            assert f.read() == "shared\n"

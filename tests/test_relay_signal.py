"""The node relay ends as its command did, a SIGKILL included: the launcher then reports the
node's exit as a shell would (137), not the relay's own failure (it exited 1 when Python
refused to reset SIGKILL's handler)."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from launcher import nodeprog, render


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_relay_ends_by_its_commands_signal(tmp_path, sig):
    relay = tmp_path / "relay.py"
    relay.write_text(nodeprog.source("relay"))
    child = f"import os, signal; print('up', flush=True); os.kill(os.getpid(), {int(sig)})"
    done = subprocess.run([sys.executable, "-S", str(relay), sys.executable, "-c", child],
                          input=render.relay_frame({}), capture_output=True, timeout=60)
    assert done.returncode == -int(sig), done.stderr
    assert done.stdout == b"up\n"

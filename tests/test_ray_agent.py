"""The Ray backend's node agent (launcher/backends/ray/agent.py) as plain Python, without a
Ray cluster: once a node's session has ended, its stdin is closed as sshd closes it, so the
node's hang-up guard (which reads that stdin and writes nowhere) ends then, not only when
the agent is killed after the run."""
from __future__ import annotations

import time

from launcher.backends.ray.agent import NodeAgent

from .helpers import limit


def _take_until_exit(agent: NodeAgent, key: str) -> tuple[bytes, int]:
    out, deadline = b"", time.monotonic() + limit(30)
    while time.monotonic() < deadline:
        o, _, code = agent.take(key, 0.5)
        out += o
        if code is not None:
            return out, code
    raise AssertionError(f"the session did not end: {out!r}")


def test_a_reader_of_the_sessions_stdin_sees_its_end_once_the_session_ended(tmp_path):
    seen = tmp_path / "eof"
    # Like templates/node.sh.j2's guard: a background reader of the session's stdin, its
    # output elsewhere, left behind by the command, which ends at once with 3.
    guard = f"exec 3<&0; (cat <&3 >/dev/null; echo eof > {seen}) >/dev/null 2>&1 & exec 3<&-; echo started; exit 3"
    agent = NodeAgent()
    agent.start("k", ["/bin/sh", "-c", guard], b"", {})
    out, code = _take_until_exit(agent, "k")
    assert (out, code) == (b"started\n", 3)
    deadline = time.monotonic() + limit(30)
    while not seen.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seen.read_text() == "eof\n"
    assert agent.write("k", b"x") is False   # nothing more reaches the ended session


def test_hang_up_of_a_running_session_ends_what_reads_its_stdin():
    agent = NodeAgent()
    agent.start("k", ["/bin/sh", "-c", "cat >/dev/null; echo done"], b"some input", {})
    assert agent.write("k", b"x") is True
    agent.hang_up("k")
    out, code = _take_until_exit(agent, "k")
    assert (out, code) == (b"done\n", 0)

"""A toy backend for tests/test_toy_backend.py: what a new backend needs to fill in
launcher/backends/base.py's Backend, and nothing more.

Backend "toy" runs each node rank as a local subprocess under a name of its own: the node's
shell is started as `/bin/sh` with argv[0] `toy-node<rank>` in a working folder of its own
(<run_dir>/toy/node<rank>), with TOY_NODE=node<rank> in its environment. Both reach the
trainer's processes (torchrun and its workers inherit the folder and the environment), so a
node's output can say which node the toy started it as. Everything else (staging, the
heartbeat that feeds the hang-up guard, control scripts, teardown) is launcher/execute/
local.py's LocalExecutor, imported, and stop's sweep is the ssh backend's, imported.

The test registers it with monkeypatch.setitem(launcher.backends.TABLE, "toy",
"tests.toy_backend:ToyBackend"); no launcher file names it.
"""
from __future__ import annotations

import os
import subprocess

from launcher import render
from launcher.backends.base import Backend, Cancel
from launcher.transport.local import LocalExecutor, LocalRunning

# (tag, rank, pid) of every node shell a ToyExecutor started in this process: the shell execs
# the trainer's command, so the pid is the node's leader (the pid its pidfile holds).
STARTED: list[tuple[str, int, int]] = []


def node_folder(run_dir: str, rank: int) -> str:
    """The working folder the toy starts node rank in."""
    return os.path.join(run_dir, "toy", f"node{rank}")


class ToyExecutor(LocalExecutor):
    """LocalExecutor whose node shells each carry their node's name (argv[0], folder, env)."""

    def __init__(self, plan=None):
        self.plan = plan   # None: a control transport (stop's sweep), which starts no node

    def start(self, node) -> LocalRunning:
        if self.plan is None:
            raise RuntimeError("a toy transport made by transport_to starts no node")
        folder = node_folder(self.plan.run_dir, node.rank)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        # As LocalExecutor.start: the script over stdin (it may hold secrets), never argv.
        proc = subprocess.Popen([f"toy-node{node.rank}", "-c", render.bootstrap()],
                                executable="/bin/sh", cwd=folder,
                                env={**os.environ, "TOY_NODE": f"node{node.rank}"},
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        STARTED.append((self.plan.tag, node.rank, proc.pid))
        try:
            proc.stdin.write(render.framed(node.script))
            proc.stdin.flush()
        except OSError:   # the shell died at once; wait() reports how
            pass
        return LocalRunning(proc)


class ToyBackend(Backend):
    """Every node a local subprocess of its own name; stop sweeps the recorded plans."""

    name = "toy"

    def transport(self, plan):
        return ToyExecutor(plan)

    def transport_to(self, logins, ssh):
        return ToyExecutor()

    def reach_nodes(self, run, force: bool) -> Cancel:
        from launcher.backends.ssh.sweep import sweep
        return sweep(run, self, kill_now=force)

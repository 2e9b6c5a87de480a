"""A toy backend for tests/test_toy_backend.py: what a new backend needs to fill in
launcher/backends/base.py's Backend, and nothing more.

Backend "toy" runs each node rank as a local subprocess under a name of its own: the node's
shell is started under the node relay in a working folder of its own (<run_dir>/toy/node<rank>),
with TOY_NODE=node<rank> in its environment. Both reach the
trainer's processes (torchrun and its workers inherit the folder and the environment), so a
node's output can say which node the toy started it as. Everything else (the relay, staging,
the heartbeat that feeds the hang-up guard, control scripts, teardown) is
launcher/transport/local.py's, imported, and stop's sweep is the ssh backend's, imported.

The test registers it with monkeypatch.setitem(launcher.backends.TABLE, "toy",
"tests.toy_backend:ToyBackend"); no launcher file names it.
"""
from __future__ import annotations

import os

from launcher import render
from launcher.backends.base import Backend, Cancel
from launcher.transport.local import LocalExecutor, LocalRunning, start_relayed

# (tag, rank, pid) of every node a ToyExecutor started in this process: the pid of the node's
# relay, which lives as long as the node's shell (the pid its pidfile holds) does.
STARTED: list[tuple[str, int, int]] = []


def node_folder(run_dir: str, rank: int) -> str:
    """The working folder the toy starts node rank in."""
    return os.path.join(run_dir, "toy", f"node{rank}")


class ToyExecutor(LocalExecutor):
    """LocalExecutor whose node shells each carry their node's name (folder, env)."""

    def __init__(self, plan=None):
        self.plan = plan   # None: a control transport (stop's sweep), which starts no node

    def start(self, node) -> LocalRunning:
        if self.plan is None:
            raise RuntimeError("a toy transport made by transport_to starts no node")
        folder = node_folder(self.plan.run_dir, node.rank)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        # As LocalExecutor.start: under the relay, the script over stdin (it may hold
        # secrets), never argv; the node's shell starts in its folder with its name.
        argv = ["/usr/bin/env", f"TOY_NODE=node{node.rank}", f"TOY_DIR={folder}",
                f"TOY_BOOT={render.bootstrap(merge_stderr=True)}",
                "/bin/sh", "-c", 'cd "$TOY_DIR" && exec /bin/sh -c "$TOY_BOOT"']
        running = start_relayed(argv, self.relay_head(), render.framed(node.script))
        STARTED.append((self.plan.tag, node.rank, running._proc.pid))
        return running


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

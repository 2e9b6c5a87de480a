"""Backend `ssh`: mlaunch (foreground) or its detached supervisor drives the nodes over SSH.

The handle is the driving process (base.py: its pid, its start time and, for a supervisor,
the run id on its command line). Control work (connect checks, staging, teardown, preflight,
`exec`) goes through fabric (launcher/transport/ssh.py); each node's output stream through an
OpenSSH client that writes the node's log file (launcher/transport/openssh.py).
Standard library only at module level (`mlaunch ps`).
"""
from __future__ import annotations

from ..base import Backend, Cancel


class SSHBackend(Backend):
    """No scheduler: every host of the spec is reached over SSH."""

    name = "ssh"

    def transport(self, plan):
        """The unconnected transport to plan's hosts; the node relay runs on the spec's
        interpreter (`exec`, which stages nothing, too)."""
        from ...plan.launch_plan import node_python
        executor = self.transport_to([n.login for n in plan.nodes], plan.job.cluster.ssh)
        executor.python = node_python(plan.job)
        return executor

    def transport_to(self, logins: list[str], ssh):
        """The unconnected transport to these logins ([user@]host[:port]) with cluster.ssh."""
        from ...transport.ssh import SSHExecutor  # fabric is imported only when SSH is really needed
        return SSHExecutor(logins, ssh)

    def warm(self, plan, executor) -> None:
        """Each node's warm frame (templates/warm.sh.j2) to its waiting session: torchrun's
        interpreter imports torch while the checks run (this machine's own nodes have none)."""
        if any(n.warm for n in plan.nodes):
            executor.warm(plan)

    def probe_spares(self, plan, printer=None):
        from . import spares   # here: the dry run imports no ssh module
        return spares.begin(plan) if printer is None else spares.at_submit(plan, printer)

    def reach_nodes(self, run, force: bool) -> Cancel:
        from .sweep import sweep
        return sweep(run, self, kill_now=force)

"""Backend `local`: every host of the spec is this machine; nodes are subprocesses, no SSH.
Standard library only at module level (`mlaunch ps`)."""
from __future__ import annotations

from ..ssh import SSHBackend


class LocalBackend(SSHBackend):
    """The ssh backend's run, teardown and stop, with subprocesses for sessions."""

    name = "local"

    def transport_to(self, logins, ssh):
        from ...transport.local import LocalExecutor
        return LocalExecutor()

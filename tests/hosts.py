"""The test hosts: a facade over tests/hostkit/ (namespaces, sshd, slurm).

Tests and fixtures import this module (``from . import hosts`` or, with tests/ on sys.path,
``import hosts``); the code lives in the package:

* hostkit/namespaces.py  network namespaces, veths, bridge, subnets, registry, cleanup
* hostkit/sshd.py        Host and HostSet: a namespace with its own hostname and sshd
* hostkit/slurm.py       a real Slurm cluster (slurmctld + one slurmd per host) over a HostSet
* hostkit/raycluster.py  a real Ray cluster (`ray start --head` in host 0, a worker per other host)
"""
from __future__ import annotations

try:  # imported as tests.hosts
    from .hostkit.namespaces import (_existing_links, _netns_pids, _pid_alive, _reg_path,  # noqa: F401
                                     cleanup_stale, skip_reason)
    from .hostkit.sshd import Host, HostSet, make_hosts  # noqa: F401
except ImportError:  # imported as a top-level module, tests/ on sys.path
    from hostkit.namespaces import (_existing_links, _netns_pids, _pid_alive, _reg_path,  # noqa: F401
                                    cleanup_stale, skip_reason)
    from hostkit.sshd import Host, HostSet, make_hosts  # noqa: F401

__all__ = ["Host", "HostSet", "make_hosts", "skip_reason", "cleanup_stale"]

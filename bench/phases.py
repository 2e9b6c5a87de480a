"""Where a flood run's fixed costs go: wall seconds of the launcher's phases (connect, stage,
start every node, the whole session), printed per call, around `bench/fanout.py ARGS`.

  python3 bench/phases.py logs --hosts 64 --mb 1 --runs 2
"""
from __future__ import annotations

import functools
import sys
import time

from launcher.logs import console
from launcher.session import attempt as job
from launcher.transport import openssh
from launcher.transport import ssh


def timed(cls, name: str, record=None) -> None:
    """Wrap cls.name: each call's wall time printed, or record(name, start, end) called."""
    f = getattr(cls, name)

    @functools.wraps(f)
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            if record is not None:
                record(name, t, time.perf_counter())
            else:
                print(f"  phase {cls.__name__}.{name}: {time.perf_counter() - t:.3f}s", file=sys.stderr, flush=True)
    setattr(cls, name, wrapper)


if __name__ == "__main__":
    for cls, name in ((ssh.SSHExecutor, "connect"), (ssh.SSHExecutor, "stage"),
                      (openssh.OpenSSHStreams, "spawn"),
                      (openssh.OpenSSHStreams, "await_ready"), (job._Session, "_start_all"),
                      (job._Session, "_wait_all"), (job._Session, "_finish"),
                      (console.Console, "close"), (ssh.SSHExecutor, "close"),
                      (job._Session, "run")):
        timed(cls, name)
    from bench import fanout
    sys.argv = ["fanout.py", *sys.argv[1:]]
    fanout.main()

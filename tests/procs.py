"""Finding this machine's processes of one mlaunch job (stdlib only: bench/ uses it too)."""
from __future__ import annotations

import glob
import secrets


def job_pids(run_id_prefix: str) -> set[int]:
    """Processes whose environment holds MLAUNCH_RUN_ID=<run_id_prefix>..., never another job's."""
    needle = f"MLAUNCH_RUN_ID={run_id_prefix}".encode()
    out = set()
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(f"{d}/environ", "rb") as fh:
                if needle in fh.read():
                    out.add(int(d[6:]))
        except OSError:
            pass
    return out


def own_name(job: str) -> str:
    """A job name of this test's own: tests find their processes by it (job_pids), and another
    suite on the machine (a second clone's CI, a --fast run) may run the same test at once."""
    return job + secrets.token_hex(3)


GUARD_PROGRAMS = {"sh", "dash", "bash", "timeout", "head", "env"}   # templates/node.sh.j2's guard


def job_pids_left(run_id_prefix: str, wait_s: float = 10.0) -> set[int]:
    """job_pids once mlaunch has returned. A node's hang-up guard (a subshell and its
    `timeout ... head -c 1`, holding the run id until it execs without it) ends only after
    mlaunch closed its side, so a process of those programs is given up to wait_s (the
    caller scales it to the load) to end; any other process still there (a rank, torchrun,
    the relay: what the teardown ends, and the guard would end later) is left at once."""
    import time
    left = job_pids(run_id_prefix)
    others = {p for p in left if program_name(p) not in (None, *GUARD_PROGRAMS)}
    deadline = time.monotonic() + wait_s
    while left and not others and time.monotonic() < deadline:
        time.sleep(0.1)
        left = job_pids(run_id_prefix)
    return others or left


def program_name(pid: int) -> str | None:
    """The base name of pid's argv[0]; None when it is gone."""
    import os
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return os.path.basename(fh.read().split(b"\0")[0].decode(errors="replace"))
    except OSError:
        return None

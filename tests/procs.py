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


def job_pids_left(run_id_prefix: str, wait_s: float = 10.0) -> set[int]:
    """job_pids once mlaunch has returned: a node's hang-up guard (a subshell holding the run
    id until its `sh` starts) ends only after mlaunch closed its side, so what is still there
    is given up to wait_s (the caller scales it to the load) to end before it counts as left."""
    import time
    deadline = time.monotonic() + wait_s
    while (left := job_pids(run_id_prefix)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left

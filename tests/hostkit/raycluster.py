"""A real Ray cluster on this machine, over the namespace hosts of tests/hosts.py.

`ray start --head` runs inside host 0, `ray start --address` inside each other host, each
under `--block` so the fixture owns the process (ended by pid, its whole group). Each node
keeps its files under a temp dir of its own (the hosts share this machine's file system) and
is small: one CPU's worth of task slots unless asked, no dashboard, the smallest object store
Ray accepts. The driver (mlaunch, in the root namespace) reaches it as a Ray Client:
ray://<host 0's ip>:10001.

Ray comes from PyPI (pinned in pyproject's test extra); without it the fixture skips.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Iterator

try:
    from ..loadfactor import limit
except ImportError:   # hostkit imported as a top-level package (tests/ on sys.path)
    from loadfactor import limit

GCS_PORT = 6379
CLIENT_PORT = 10001
OBJECT_STORE_BYTES = 80 * 2**20   # Ray's floor is 75 MiB


def skip_reason() -> str | None:
    """Why a Ray cluster cannot be built here, or None."""
    if os.geteuid() != 0:
        return "Ray test cluster needs root (namespace hosts)"
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install -e '.[test]' installs it; ./run-tests.sh does)"
    if not ray_bin():
        return "the `ray` command is not on PATH beside this interpreter"
    return None


def ray_bin() -> str | None:
    """The `ray` script of this interpreter's installation."""
    here = os.path.join(os.path.dirname(sys.executable), "ray")
    return here if os.path.exists(here) else shutil.which("ray")


class RayCluster:
    """One running Ray cluster: a head in hs[0], a worker in each other host."""

    def __init__(self, hs, cpus: int = 2):
        self.hs, self.cpus = hs, cpus
        self.dir = tempfile.mkdtemp(prefix=f"mlray-{hs.tag}-", dir="/tmp")
        self.head = hs[0]
        self.address = f"ray://{self.head.ip}:{CLIENT_PORT}"
        self.gcs = f"{self.head.ip}:{GCS_PORT}"
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, timeout: float | None = None) -> "RayCluster":
        timeout = limit(120) if timeout is None else timeout
        self._start(self.head, ["--head", f"--port={GCS_PORT}", "--include-dashboard=false",
                                f"--ray-client-server-port={CLIENT_PORT}",
                                f"--temp-dir={self.dir}/tmp"])
        for h in self.hs.hosts[1:]:
            # Workers take the head's temp dir (one file system for every host); Ray numbers
            # each node's sockets there (raylet, raylet.1, ...).
            # One at a time: two nodes starting at once may pick the same socket name.
            self._start(h, [f"--address={self.gcs}"])
            self._wait_started(h, timeout)
        self.wait_nodes(len(self.hs), timeout)
        return self

    def _start(self, h, args: list[str]) -> None:
        log = open(os.path.join(self.dir, f"{h.name}.out"), "wb")
        # HOME of the cluster's own: Ray reads ~/.ray/auth_token, and a stray one (left by an
        # interrupted session) made every worker's login to the head fail (InvalidAuthToken)
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HOME": self.dir}
        argv = [ray_bin(), "start", "--block", *args, f"--node-ip-address={h.ip}",
                f"--num-cpus={self.cpus}", "--num-gpus=0",
                f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats"]
        try:
            self.procs[h.name] = h.popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        finally:
            log.close()

    def _wait_started(self, h, timeout: float) -> None:
        """Until `ray start` on h says its node runs (its own line)."""
        path, end = os.path.join(self.dir, f"{h.name}.out"), time.monotonic() + timeout
        while True:
            with open(path, errors="replace") as f:
                if "Ray runtime started" in f.read():
                    return
            if self.procs[h.name].poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"ray start on {h.name} did not start\n{self.logs()}")
            time.sleep(0.2)

    def alive_nodes(self) -> int:
        """Ray's count of live nodes, asked from the head host."""
        r = self.head.run([sys.executable, "-c", _COUNT, self.gcs], timeout=limit(60))
        try:
            return int(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return -1

    def wait_nodes(self, n: int, timeout: float) -> None:
        """Until Ray counts n live nodes; RuntimeError with the nodes' logs past timeout."""
        end = time.monotonic() + timeout
        while self.alive_nodes() != n:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"ray start on {name} exited {p.returncode}\n{self.logs()}")
            if time.monotonic() > end:
                raise RuntimeError(f"Ray cluster: not {n} live nodes after {timeout}s\n{self.logs()}")
            time.sleep(1)

    def raylet_pid(self, h) -> int | None:
        """The pid (here) of host h's raylet."""
        for pid in h.pids():
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                if argv and argv[0].endswith(b"/raylet"):
                    return pid
        return None

    def ray_pids(self, h) -> set[int]:
        """Host h's processes that belong to Ray itself (its daemons, the ray start, idle
        workers): every one of h.pids() in the group `ray start` leads, or a Ray worker."""
        p = self.procs.get(h.name)
        out = set()
        for pid in h.pids():
            with contextlib.suppress(OSError):
                if p is not None and os.getpgid(pid) == p.pid:
                    out.add(pid)
        return out

    def logs(self) -> str:
        out = []
        for name in sorted(os.listdir(self.dir)):
            if name.endswith(".out"):
                with open(os.path.join(self.dir, name), errors="replace") as f:
                    out.append(f"--- {name}\n{f.read()[-3000:]}")
        return "\n".join(out)

    def close(self) -> None:
        """End every node this fixture started (its process group, by pid), then its files."""
        for p in reversed(list(self.procs.values())):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        if not os.environ.get("MLAUNCH_KEEP_RAY_LOGS"):   # set: the nodes' logs stay for a look
            shutil.rmtree(self.dir, ignore_errors=True)


_COUNT = """
import sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(sum(1 for n in ray.nodes() if n["Alive"]))
"""


@contextlib.contextmanager
def make_ray(hs, cpus: int = 2) -> Iterator[RayCluster]:
    """A Ray cluster over hs, torn down on exit."""
    cluster = RayCluster(hs, cpus)
    try:
        yield cluster.start()
    finally:
        cluster.close()

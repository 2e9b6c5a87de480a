"""CPU seconds per test, counted by the kernel: each pytest process (each xdist worker) in a
cgroup of its own (v1 cpuacct), which every process it starts inherits. So a test's figure
holds all it made run: trainer ranks, torchrun, the namespace hosts' sshd sessions, Slurm's
daemons and jobs. pytest's --durations ranks by wall time, which on a busy machine says how
long a test waited for a core; this ranks by what each test costs the suite (issue 26: the
suite is CPU-bound, both cores busy). Root and a writable cpuacct hierarchy only; elsewhere
it says why once and counts nothing.
"""
from __future__ import annotations

import os
import time

import pytest

from .loadfactor import limit

ROOT = "/sys/fs/cgroup/cpuacct"
TOP = 30   # the costliest test phases listed at the end, as many as --durations=30


class CpuAccounting:
    """A pytest process's cgroup and the CPU seconds each test phase took in it."""

    def __init__(self, group: str | None, why: str = ""):
        self.group, self.why = group, why
        self.seen: dict[tuple[str, str], float] = {}   # (nodeid, phase) -> CPU s (controller)

    @classmethod
    def join(cls, name: str) -> "CpuAccounting":
        """This process in a new cgroup `name` (its children follow), or one that counts nothing."""
        if os.geteuid() != 0:
            return cls(None, "not root")
        if not os.access(os.path.join(ROOT, "cgroup.procs"), os.W_OK):
            return cls(None, f"no writable cgroup v1 cpuacct hierarchy at {ROOT}")
        group = os.path.join(ROOT, name)
        try:
            os.makedirs(group, exist_ok=True)
            with open(os.path.join(group, "cgroup.procs"), "w") as fh:
                fh.write(str(os.getpid()))
        except OSError as e:
            return cls(None, f"cannot join {group}: {e.strerror}")
        return cls(group)

    def usage(self) -> float:
        with open(os.path.join(self.group, "cpuacct.usage")) as fh:
            return int(fh.read()) / 1e9

    def leave(self) -> None:
        """Back to the root group; the group goes unless a process the tests left is in it."""
        if self.group is None:
            return
        try:
            with open(os.path.join(ROOT, "cgroup.procs"), "w") as fh:
                fh.write(str(os.getpid()))
            os.rmdir(self.group)
        except OSError:
            pass   # a leftover process keeps it; the next run's names differ

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        yield from self._phase(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        yield from self._phase(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item):
        yield from self._phase(item, "teardown")

    def _phase(self, item, when: str):
        if self.group is None:
            yield
            return
        start = self.usage()
        yield
        item.stash.setdefault(CPU_KEY, {})[when] = self.usage() - start

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        cpu = item.stash.get(CPU_KEY, {}).get(call.when)
        if cpu is not None:   # user_properties travel with the report to xdist's controller
            outcome.get_result().user_properties.append(("cpu_s", round(cpu, 3)))

    def pytest_runtest_logreport(self, report):
        cpu = dict(report.user_properties).get("cpu_s")
        if cpu is not None:
            self.seen[(report.nodeid, report.when)] = cpu

    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        if not self.seen:
            tr.write_line(f"cpu per test: not counted ({self.why or 'no test ran'})")
            return
        total = sum(self.seen.values())
        tr.write_sep("=", f"costliest {TOP} test phases by CPU (all the processes each started)")
        for (nodeid, when), cpu in sorted(self.seen.items(), key=lambda kv: -kv[1])[:TOP]:
            tr.write_line(f"{cpu:8.1f}s cpu {when:8s} {nodeid} ({cpu / total if total else 0:.1%})")
        by_file: dict[str, float] = {}
        for (nodeid, _), cpu in self.seen.items():
            by_file[nodeid.split("::")[0]] = by_file.get(nodeid.split("::")[0], 0.0) + cpu
        path = self._save()
        tr.write_line(f"cpu per test: {total:.0f} s in all; every test's in {path}; the costliest files: "
                      + ", ".join(f"{f} {s:.0f} s" for f, s in sorted(by_file.items(), key=lambda kv: -kv[1])[:8]))

    def _save(self) -> str:
        # Every phase's figure, for a look past the 30 (e.g. per file, per fixture).
        import json
        import tempfile
        fd, path = tempfile.mkstemp(prefix="mlaunch-test-cpu-", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump([{"test": t, "phase": w, "cpu_s": c} for (t, w), c in sorted(self.seen.items())], fh)
        return path

    def pytest_unconfigure(self, config):
        self.leave()


CPU_KEY = pytest.StashKey[dict]()


def register(config: pytest.Config) -> None:
    """Count in this process (an xdist worker, or pytest without -n); the controller of an
    xdist run only sums what its workers report."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    controller = config.getoption("numprocesses", None) not in (None, 0) and worker is None
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getppid() if worker else os.getpid()))[:12]
    plugin = Controller(None, "counted in the workers") if controller else \
        CpuAccounting.join(f"mlaunch-tests-{run}-{worker or 'main'}")
    config.pluginmanager.register(plugin, "mlaunch-cpuacct")


class Controller(CpuAccounting):
    """An xdist controller: sums what its workers report, and removes their groups at the end.

    A worker removes its own group as it ends, but a worker still busy after the shutdown
    request is interrupted (5 s, execnet's worker side) and killed (10 s, execnet's
    Group.terminate), and on a loaded machine its teardown can take that long (loaded runs 14,
    21, 23: workers' groups left behind). The controller's unconfigure comes after, so it
    removes what such a worker left.
    """

    def pytest_unconfigure(self, config):
        session = config.pluginmanager.getplugin("dsession")
        nodes = getattr(session, "nodemanager", None)
        if os.geteuid() != 0 or nodes is None:
            return
        prefix = f"mlaunch-tests-{nodes.testrunuid[:12]}-gw"
        try:
            names = [n for n in os.listdir(ROOT) if n.startswith(prefix)]
        except OSError:
            return
        for name in names:
            _remove_when_empty(os.path.join(ROOT, name))


def _remove_when_empty(group: str) -> None:
    """rmdir `group` once its processes are gone: a killed worker leaves it as its exit
    completes, which takes a moment; a process a test leaked keeps it (its name says whose)."""
    deadline = time.monotonic() + limit(10)
    while True:
        try:
            os.rmdir(group)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)

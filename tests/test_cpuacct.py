"""The suite's CPU accounting (tests/cpuacct.py): a test's figure holds the CPU of every
process it started, waited for or not, with and without pytest-xdist's workers."""
from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import textwrap
import time

import pytest

from .cpuacct import ROOT as CGROUPS
from .helpers import ROOT
from .loadfactor import limit

BURN = textwrap.dedent('''
    import os, subprocess, sys, time

    # A grandchild in a session of its own, never waited for by this process: only the
    # cgroup sees its CPU. It burns BURN_S of CPU time (process_time: not wall time).
    SPIN = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < {s}: pass"

    def test_burn(tmp_path):
        with open("cgroup.txt", "w") as fh:   # the group this test runs in, for the outer test
            fh.write(open("/proc/self/cgroup").read())
        done = tmp_path / "done"
        subprocess.run([sys.executable, "-c",
                        "import os, subprocess, sys\\n"
                        "if os.fork() == 0:\\n"
                        "    os.setsid()\\n"
                        "    subprocess.run([sys.executable, '-c', %r])\\n"
                        "    open(%r, 'w').close()\\n"
                        "    os._exit(0)\\n" % (SPIN, str(done))], check=True)
        while not done.exists():   # a wait that costs next to no CPU itself
            time.sleep(0.01)
''')


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_cpu_of_a_test_counts_a_grandchild_it_never_waited_for(tmp_path, workers):
    if os.geteuid() != 0 or not os.access(os.path.join(CGROUPS, "cgroup.procs"), os.W_OK):
        pytest.skip(f"needs root and a writable cgroup v1 cpuacct hierarchy at {CGROUPS}")
    burn_s = 0.5
    # The inner run's groups carry this id (cpuacct.register names them by the run's uid): other
    # pytest runs on the machine (a second clone's CI) make and remove groups of their own meanwhile.
    uid = secrets.token_hex(6)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env |= {"PYTHONPATH": ROOT, "PYTEST_XDIST_TESTRUNUID": uid}
    if workers:
        workers = [*workers, f"--testrunuid={uid}"]
    (tmp_path / "conftest.py").write_text("from tests import cpuacct\n\n\n"
                                          "def pytest_configure(config):\n    cpuacct.register(config)\n")
    (tmp_path / "test_burn.py").write_text(BURN.replace("{s}", str(burn_s)))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                        *workers, "test_burn.py"], cwd=tmp_path, capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    m = re.search(r"([\d.]+)s cpu call\s+test_burn.py::test_burn", r.stdout)
    assert m, r.stdout[-3000:]
    # The figure holds the grandchild's burn (the test itself sleeps while it waits).
    assert float(m.group(1)) >= burn_s, r.stdout[-3000:]
    saved = re.search(r"cpu per test: \d+ s in all; every test's in (\S+); the costliest files: test_burn.py",
                      r.stdout)
    assert saved, r.stdout[-3000:]
    rows = json.load(open(saved.group(1)))
    assert {(x["test"], x["phase"]) for x in rows} >= {("test_burn.py::test_burn", "call")}
    os.unlink(saved.group(1))
    # Each of its processes left its cgroup at the end, and the groups went with them (a worker
    # xdist killed has its group removed by the controller: the test below). Waited for, as for
    # any process's end: loaded runs 11 and 14 saw the controller return first.
    deadline = time.monotonic() + limit(60)
    while (mine := {g for g in groups() if g.startswith(f"mlaunch-tests-{uid}")}) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not mine, sorted(mine)
    joined = (tmp_path / "cgroup.txt").read_text()   # so the check above was about a real group
    assert re.search(rf"cpuacct.*/mlaunch-tests-{uid}-(main|gw[01])$", joined, re.M), joined


def groups() -> set[str]:
    return {d for d in os.listdir(CGROUPS) if d.startswith("mlaunch-tests-")}


def test_groups_a_worker_did_not_remove_go_with_the_run(tmp_path):
    """A worker that has not ended in time is interrupted (5 s) then killed (10 s) by
    xdist/execnet before it can leave its group (loaded runs 14, 21): the controller removes
    its workers' groups once they are empty. The workers here never remove theirs, for any reason
    (a hang in unconfigure did not make it deterministic: under load execnet got there first)."""
    if os.geteuid() != 0 or not os.access(os.path.join(CGROUPS, "cgroup.procs"), os.W_OK):
        pytest.skip(f"needs root and a writable cgroup v1 cpuacct hierarchy at {CGROUPS}")
    uid = secrets.token_hex(6)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env |= {"PYTHONPATH": ROOT}
    (tmp_path / "conftest.py").write_text(textwrap.dedent('''
        from tests import cpuacct

        def pytest_configure(config):
            cpuacct.CpuAccounting.leave = lambda self: None   # as if killed before it left
            cpuacct.register(config)
    '''))
    (tmp_path / "test_one.py").write_text(
        "def test_one():\n    open('cgroup.txt', 'w').write(open('/proc/self/cgroup').read())\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                        "-n", "2", f"--testrunuid={uid}", "test_one.py"], cwd=tmp_path, capture_output=True,
                       text=True, env=env, timeout=limit(300))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    joined = (tmp_path / "cgroup.txt").read_text()   # the test ran in a group of this run
    assert re.search(rf"cpuacct.*/mlaunch-tests-{uid}-gw[01]$", joined, re.M), joined
    # The controller returned after removing them: no wait here.
    assert not {g for g in groups() if g.startswith(f"mlaunch-tests-{uid}")}

"""Shared pytest fixtures for mlaunch tests."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import tempfile
from typing import Callable, ContextManager, Iterator

import pytest

try:  # `tests` imported as a package
    from . import cpuacct as _cpuacct
    from . import hosts as _hosts
    from . import loadfactor as _loadfactor
except ImportError:  # rootdir-relative import (tests/ on sys.path, no __init__)
    if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # importlib mode
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cpuacct as _cpuacct
    import hosts as _hosts
    import loadfactor as _loadfactor


# Every mlaunch the tests start registers its runs here, never in the user's ~/.mlaunch.
os.environ["MLAUNCH_HOME"] = tempfile.mkdtemp(prefix="mlaunch-test-home-")
# configs/seed000 and the Slurm example take HF_TOKEN from the shell (`${HF_TOKEN}`, issue 56):
# the tests' stand-in value, which the golden files and the secret checks look for.
os.environ["HF_TOKEN"] = "hf_secret_value_123"

# The tests send Ctrl-C and hang-ups to what they start, as a terminal would. Whatever started
# the suite may have left SIGINT or SIGHUP ignored (`cmd &` in a script ignores SIGINT and
# SIGQUIT, `nohup` SIGHUP), and an ignored signal stays ignored through fork and exec: every
# mlaunch the tests start would then shrug off its Ctrl-C (Python installs no KeyboardInterrupt
# handler where SIGINT is ignored at start). This process (each xdist worker imports this file)
# takes a terminal's dispositions, so its children start with the defaults.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGHUP, signal.SIG_DFL)
signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def pytest_configure(config: pytest.Config) -> None:
    # Measured once, before any worker starts: every wait limit is stretched by it
    # (tests/loadfactor.py); pytest-xdist's workers inherit it through the environment.
    n = config.getoption("numprocesses", None)   # pytest-xdist's -n ("auto", a number, None)
    _loadfactor.load_factor(workers=os.cpu_count() or 1 if n in ("auto", "logical")
                            else int(n or 1))
    _cpuacct.register(config)   # CPU seconds per test, listed at the end (tests/cpuacct.py)
    # pytest-xdist's load scheduling re-sorts the groups by their number of tests, which put
    # the long training files (1-3 tests each) last: the order heaviest_groups_first gives is kept.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    config.addinivalue_line(
        "markers",
        "multihost: needs real namespace+sshd hosts (tests/hosts.py); "
        "skipped when they cannot be built (not root, no sshd, no netns...)")


def pytest_report_header(config: pytest.Config) -> str:
    return f"load factor {_loadfactor.load_factor():g} (wait limits x that; {_loadfactor.ENV})"


HOST_FIXTURES = {"make_hostset", "hosts2", "slurm2", "slurm3", "ray3"}   # each needs namespace hosts (or Slurm)
SLURM_FIXTURES = {"slurm2", "slurm3"}


@pytest.hookimpl(tryfirst=True)   # before pytest-xdist reads the xdist_group marks (--dist loadgroup)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test that takes a host fixture is multihost whether or not it says so: the fast
    # inner loop (run-tests.sh --fast, -m "not multihost ...") never starts hosts.
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if HOST_FIXTURES & names:
            item.add_marker(pytest.mark.multihost)
        # run-tests.sh runs `--dist loadgroup`: a file's tests stay on one worker (its
        # module-scoped fixtures are built once), and every test of a Slurm cluster runs on the
        # same worker, because only one cluster can run on this machine at a time: the other
        # worker runs other files instead of waiting on the Slurm lock.
        group = "slurm" if SLURM_FIXTURES & names else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
    heaviest_groups_first(items)


# Each test file's CPU seconds and test count from a suite run (tools/test_costs.py writes it)
COSTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "costs.json")
# A test of a file the table does not know: a rough cost by its marks (CPU seconds)
GUESS = (("training", 30.0), ("multihost", 3.0), ("launches", 1.0))


def _group(item: pytest.Item) -> str:
    return item.get_closest_marker("xdist_group").args[0]


def _cost(item: pytest.Item, files: dict) -> float:
    """A test's expected CPU: its file's mean from the table, else a guess from its marks."""
    name = item.nodeid.split("::")[0]
    if name in files and files[name][1]:
        return files[name][0] / files[name][1]
    return next((c for m, c in GUESS if item.get_closest_marker(m)), 0.2)


def heaviest_groups_first(items: list[pytest.Item]) -> None:
    """Order the groups by their expected CPU, heaviest first, each group's tests in their
    own order. pytest-xdist re-sorted the groups by their number of tests (pytest_configure
    turns that off) and then hands them out in order: the long training files, with 1-3 tests
    each, came last and ran on one or two workers while the others had nothing left
    (longest-first is the classic cure); the unit tests now fill the end."""
    try:
        with open(COSTS) as fh:
            files = json.load(fh)["files"]
    except (OSError, ValueError, KeyError):
        files = {}
    weight: dict[str, float] = {}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        g = _group(item)
        first.setdefault(g, i)
        weight[g] = weight.get(g, 0.0) + _cost(item, files)
    items.sort(key=lambda it: (-weight[_group(it)], first[_group(it)]))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("multihost") is not None:
        reason = _hosts.skip_reason()
        if reason is not None:
            pytest.skip(reason)


@pytest.fixture
def make_hostset() -> Iterator[Callable[..., ContextManager[_hosts.HostSet]]]:
    """Factory: ``with make_hostset(n, tag=None, isolated_home=False, private_disk=False) as hs:``
    (private_disk: hosts that share no disk at ``hs.disk``, see hostkit/sshd.py make_hosts).

    Skips the test when hosts cannot be built here.  Any HostSet the test
    left open is torn down when the test ends."""
    reason = _hosts.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with contextlib.ExitStack() as stack:
        def factory(n: int, tag: str | None = None,
                    **kw) -> ContextManager[_hosts.HostSet]:
            cm = _hosts.make_hosts(n, tag, **kw)

            @contextlib.contextmanager
            def tracked() -> Iterator[_hosts.HostSet]:
                with cm as hs:
                    # Safety net if the test enters but never exits.
                    stack.callback(hs.close, raise_errors=False)
                    yield hs
            return tracked()
        yield factory


@pytest.fixture
def hosts2(make_hostset) -> Iterator[_hosts.HostSet]:
    """A fresh 2-host HostSet per test (setup+teardown is ~0.2 s, and tests
    may stop sshd or pull links, so it is deliberately function-scoped)."""
    with make_hostset(2) as hs:
        yield hs


@pytest.fixture
def slurm2(make_hostset):
    """A real 2-node Slurm cluster (slurmctld + a slurmd per namespace host); skips with the
    reason where it cannot run. Yields the SlurmCluster; its HostSet is `.hs`."""
    yield from _slurm_cluster(make_hostset, 2)


@pytest.fixture
def slurm3(make_hostset):
    """slurm2's cluster with 3 nodes (a 2-node job that can leave one out)."""
    yield from _slurm_cluster(make_hostset, 3)


@pytest.fixture(scope="module")
def ray3():
    """A real 3-node Ray cluster (tests/hostkit/raycluster.py: `ray start --head` in one
    namespace host, `ray start --address` in two more), one per test file: starting one costs
    about 20 s here. Skips with the reason where it cannot run (no ray, not root)."""
    try:
        from .hostkit import raycluster as _ray
    except ImportError:
        from hostkit import raycluster as _ray
    reason = _hosts.skip_reason() or _ray.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with _hosts.make_hosts(3) as hs, _ray.make_ray(hs, cpus=2) as cluster:
        yield cluster


def _slurm_cluster(make_hostset, n: int):
    try:
        from .hostkit import slurm as _slurm
    except ImportError:
        from hostkit import slurm as _slurm
    reason = _slurm.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    # One Slurm cluster at a time on this machine, also when pytest-xdist runs tests in parallel.
    with open(os.path.join(tempfile.gettempdir(), "mlaunch-tests-slurm.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with make_hostset(n) as hs, _slurm.make_slurm(hs) as cluster:
            yield cluster

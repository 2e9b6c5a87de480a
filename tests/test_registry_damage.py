"""The run registry under another writer's lock, damage, an immutable directory and truncation."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from launcher.record.events import read_events
from launcher.record.registry import Registry

from .loadfactor import limit
from .helpers import ROOT, free_port, write_spec
from .runs import Runs

SCRIPTS = os.path.join(ROOT, "tests", "scripts")
LOCKER = ("import sqlite3, sys; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
          "db.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); sys.stdin.readline(); "
          "db.execute('COMMIT')")


@pytest.fixture
def runs(tmp_path) -> Runs:
    r = Runs(str(tmp_path / "home"))
    r.env["MLAUNCH_REGISTRY_TIMEOUT_S"] = "0.2"
    return r


def _job(tmp_path, *args: str, name: str = "t") -> dict:
    return {"name": name, "trainer": "script",
            "cluster": {"hosts": ["localhost"], "gpus_per_node": 1, "python": sys.executable,
                        "master_port": free_port()},
            "script": {"path": os.path.join(SCRIPTS, "wait_for_file.py"), "args": list(args)},
            "output_dir": str(tmp_path / "out")}


def _wait(cond, what: str, timeout: float = 120):
    deadline = time.monotonic() + limit(timeout)
    while not (got := cond()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return got


def _attempts(db: str, run_id: str):
    reg = Registry(db)
    try:
        return reg.attempts(run_id)
    finally:
        reg.close()


@pytest.mark.launches
def test_a_lock_held_past_the_timeout_never_fails_a_run(tmp_path, runs):
    db, go = os.path.join(runs.home, "runs.db"), str(tmp_path / "go")
    sub = runs.popen("submit", write_spec(tmp_path, _job(tmp_path, go)), "--no-preflight",
                     "--run-id", "held")
    _wait(lambda: os.path.exists(db) and _attempts(db, "held"), "the attempt never started")
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, db], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout.readline() == "locked\n"
        open(go, "w").close()                      # the trainer exits 0 under the lock
        for line in sub.stdout:
            if "is locked by another process" in line:
                break
        assert line == (f"[mlaunch] run registry {db} is locked by another process; retrying "
                        "until it is free (the run goes on)\n"), line
        stop = runs.cli("stop", "held")
        assert stop.returncode == 2 and stop.stdout == "", stop.stdout + stop.stderr
        assert stop.stderr.startswith(f"mlaunch: run registry {db}: locked by another process "
                                      "for over 0.2 s (database is locked); try again once it "
                                      "is free") and stop.stderr.count("\n") == 1, stop.stderr
    finally:
        locker.communicate("\n", timeout=limit(30))
    rest, err = sub.communicate(timeout=limit(120))
    assert sub.returncode == 0, rest[-2000:] + err
    row = runs.run("held")
    assert (row["state"], row["exit_code"]) == ("succeeded", 0), row
    assert [(a.state, a.exit_code) for a in _attempts(db, "held")] == [("succeeded", 0)]
    ends = [e for e in read_events(os.path.join(row["log_dir"], "events.jsonl"))
            if e["event"] == "run_end"]
    assert [e["code"] for e in ends] == [0]


def _registry_with_a_run(runs) -> str:
    db = os.path.join(runs.home, "runs.db")
    reg = Registry(db)
    for i in range(40):   # enough rows for several pages
        reg.create(f"job-{i:03d}", name="job", backend="local", hosts=["localhost"],
                   spec={"name": "job", "pad": "x" * 500}, detached=False, supervisor=(0, None),
                   log_dir="/nonexistent", output_dir=None)
    reg.close()           # the last connection checkpoints the WAL into runs.db
    assert os.path.getsize(db) > 3 * 4096
    return db


def _overwrite(db: str, offset: int, size: int) -> None:
    with open(db, "r+b") as fh:
        fh.seek(offset)
        fh.write(b"\xa5" * size)


def _damage_header(db):
    _overwrite(db, 0, 100)


def _damage_pages(db):
    _overwrite(db, 4096, os.path.getsize(db) - 4096)


def _truncate(db):
    os.truncate(db, 0)


DAMAGED = "damaged ({}); move it aside (mv {db} {db}.damaged) and recover what you can with " \
          "`sqlite3 {db}.damaged .recover`, or set MLAUNCH_HOME to another directory"
CASES = {
    "header": (_damage_header, DAMAGED.replace("({})", "(file is not a database)")),
    "pages": (_damage_pages, DAMAGED.replace("({})", "(database disk image is malformed)")),
    "truncated": (_truncate, "truncated to 0 bytes (it held runs: {db}.created exists); restore it "
                             "from a backup, or remove both files to start an empty registry"),
}


def _assert_refused(runs, tmp_path, expected: str) -> None:
    """ps / logs / stop / submit: one line naming the file and the fix, exit 2, nothing started."""
    spec = write_spec(tmp_path, _job(tmp_path, str(tmp_path / "go")))
    for args in (["ps"], ["ps", "--all"], ["logs", "job-001"], ["stop", "job-001"],
                 ["submit", spec, "--no-preflight"], ["submit", "-d", spec, "--no-preflight"]):
        r = runs.cli(*args)
        assert r.returncode == 2 and r.stdout == "", (args, r.stdout + r.stderr)
        assert r.stderr == f"mlaunch: {expected}\n", (args, r.stderr)
    assert not (tmp_path / "out").exists() and not os.path.exists(os.path.join(runs.home, "runs"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_damaged_or_truncated_registry_is_one_line_and_starts_nothing(tmp_path, runs, case):
    db = _registry_with_a_run(runs)
    damage, fix = CASES[case]
    damage(db)
    with open(db, "rb") as fh:
        before = fh.read()
    _assert_refused(runs, tmp_path, f"run registry {db}: " + fix.format(db=db))
    with open(db, "rb") as fh:
        assert fh.read() == before   # refused without writing a byte: the damage is left to look at


def test_an_immutable_registry_directory_is_one_line_and_starts_nothing(tmp_path, runs):
    db = _registry_with_a_run(runs)
    r = subprocess.run(["chattr", "+i", runs.home], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"chattr +i is not available here: {r.stderr.strip()}")
    try:
        _assert_refused(runs, tmp_path, f"run registry {db}: its directory {runs.home} is not "
                        "writable (read-only or immutable); make it writable (chmod u+w, chattr "
                        "-i, or remount) or set MLAUNCH_HOME to a writable directory")
    finally:
        subprocess.run(["chattr", "-i", runs.home], check=True)


NOT_A_RUN = ("not a run id or job name (1-128 letters, digits, '.', '_', '-'); see "
             "`mlaunch ps --all` for the runs")


@pytest.mark.parametrize("ref", ["x" * 129, "y" * 100_000, "%", "a b", "job'; DROP TABLE runs; --",
                                 "é"])
def test_a_run_argument_of_any_length_is_one_line(runs, ref):
    _registry_with_a_run(runs)
    shown = repr(ref if len(ref) <= 60 else ref[:57] + "...")
    for cmd in ("ps", "logs", "stop", "attach"):
        r = runs.cli(cmd, ref)
        assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
        assert r.stderr == f"mlaunch: RUN {shown}: {NOT_A_RUN}\n", r.stderr
    assert len(runs.ps()) == 40


def test_stop_refuses_an_empty_or_short_run_argument_naming_the_candidates(runs):
    reg = Registry(os.path.join(runs.home, "runs.db"))
    for run_id, name in (("job-a", "job"), ("jobx-b", "jobx")):
        reg.create(run_id, name=name, backend="local", hosts=["localhost"], spec={"name": name},
                   detached=False, supervisor=(0, None), log_dir="/nonexistent", output_dir=None)
    reg.close()
    for ref in ("", "j", "jo"):
        r = runs.cli("stop", ref)
        assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
        assert r.stderr == (f"mlaunch: RUN {ref!r}: too short to pick one run (candidates: "
                            "jobx-b, job-a); give at least 3 characters of the id, or the job "
                            "name\n"), r.stderr
    assert {x["id"]: x["state"] for x in runs.ps()}["jobx-b"] == "lost"   # untouched by the refusals



def test_a_first_command_that_loses_the_race_to_mark_the_registry_goes_on(tmp_path, monkeypatch):
    """Two first commands at once (CI: 20 `ps` readers beside a first submit) both see no
    marker, and the second to create it found it made meanwhile: it goes on (was
    FileExistsError, printed as a registry error). The race is made certain by letting
    the check before the create see no marker."""
    from launcher.record import regguard
    path = str(tmp_path / "runs.db")
    Registry(path).close()                       # the winner: tables and marker
    marker = path + regguard.MARKER
    before = open(marker).read()
    real_exists = os.path.exists
    monkeypatch.setattr(regguard.os.path, "exists", lambda p: False if p == marker else real_exists(p))
    regguard.mark_created(path)                  # the loser
    Registry(path).close()
    assert open(marker).read() == before and "created with its tables" in before

"""The run registry: resolving RUN, the pid marker, and safety under concurrent writers and readers."""
from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time

import pytest

from launcher.backends.base import proc_start
from launcher.record.registry import ACTIVE, FINAL, STATES, Registry

from .loadfactor import limit
from .helpers import ROOT, free_port
from .runs import CLI, Runs

SCRIPTS = os.path.join(ROOT, "tests", "scripts")


@pytest.fixture
def runs(tmp_path) -> Runs:
    return Runs(str(tmp_path / "home"))


def record(runs: Runs, run_id: str, name: str = "job", pid: int | None = None,
           start: int | None = None, detached: bool = True) -> Registry:
    reg = Registry(os.path.join(runs.home, "runs.db"))
    reg.create(run_id, name=name, backend="local", hosts=["localhost"], spec={"name": name},
               detached=detached, supervisor=(pid or 0, start), log_dir="/nonexistent",
               output_dir=None)
    return reg


def test_run_is_a_unique_prefix_or_the_latest_run_of_a_job_name(runs):
    reg = record(runs, "alpha-20260101-000000-aaaa", name="alpha")
    reg.create("alpha-20260101-000100-bbbb", name="alpha", backend="local", hosts=["localhost"],
               spec={}, detached=False, supervisor=(0, None), log_dir="/x", output_dir=None)
    for run_id in ("alpha-20260101-000000-aaaa", "alpha-20260101-000100-bbbb"):
        reg.set_state(run_id, "succeeded", exit_code=0)
    assert reg.resolve("alpha").id == "alpha-20260101-000100-bbbb"           # job name: latest
    assert reg.resolve("alpha-20260101-0000").id == "alpha-20260101-000000-aaaa"  # unique prefix
    assert reg.resolve("nothing") is None
    r = runs.cli("logs", "alpha-2026")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "RUN 'alpha-2026': matches several runs" in r.stderr and "give more of the id" in r.stderr
    r = runs.cli("stop", "nothing")
    assert r.returncode == 2 and "no run with this id prefix or job name" in r.stderr


def test_ps_finds_a_dead_or_reused_supervisor_lost(runs):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "live-run-1"])
    try:
        start = proc_start(sleeper.pid)
        record(runs, "live-run-1", pid=sleeper.pid, start=start)             # the real marker
        record(runs, "reused-pid", pid=sleeper.pid, start=start - 1)         # same pid, other start
        record(runs, "wrong-cmdline", pid=sleeper.pid, start=start)          # run id not in argv
        record(runs, "dead", pid=2**22 + 7, start=1)
        states = {r["id"]: r["state"] for r in runs.ps()}
        assert states == {"live-run-1": "starting", "reused-pid": "lost", "wrong-cmdline": "lost",
                          "dead": "lost"}
        table = runs.cli("ps").stdout.splitlines()
        assert table[0].split() == ["ID", "NAME", "STATE", "NODES", "AGE", "ATTEMPTS", "EXIT"]
        assert len(table) == 5  # active and lost runs are shown without --all
    finally:
        sleeper.kill()
        sleeper.wait()
    assert {r["id"]: r["state"] for r in runs.ps()}["live-run-1"] == "lost"


def _writer(db: str, run_id: str, what: str, n: int) -> None:
    reg = Registry(db)
    for i in range(n):
        if what == "handle":
            reg.set_handle(run_id, {"n": i})
        else:
            reg.attempt_started(run_id, i, f"{run_id}+a{i}", ["/x"], None)
            reg.set_state(run_id, "restarting", only_from=("running",))


def _ps_loop(env: dict, stop: threading.Event, seen: list, errors: list) -> None:
    mine: list = []
    seen.append(mine)
    while not stop.is_set():
        _ps_once(env, mine, errors)


@pytest.mark.launches
def test_two_writers_on_one_row_lose_no_update_while_20_ps_read(runs):
    reg = record(runs, "busy", pid=os.getpid(), start=proc_start(os.getpid()), detached=False)
    db = os.path.join(runs.home, "runs.db")
    stop, seen, errors = threading.Event(), [], []
    readers = [threading.Thread(target=_ps_loop, args=(runs.env, stop, seen, errors)) for _ in range(20)]
    for t in readers:
        t.start()
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_writer, args=(db, "busy", what, 300)) for what in ("handle", "attempts")]
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=limit(300))
    stop.set()
    for t in readers:
        t.join()
    assert [w.exitcode for w in writers] == [0, 0]
    assert not errors, errors[:3]
    assert sum(map(len, seen)) >= 20
    run = reg.get("busy")
    assert run.handle == {"n": 299} and run.attempts == 300
    assert [a.n for a in reg.attempts("busy")] == list(range(300))
    for snapshot in (snap for mine in seen for snap in mine):
        row = next(r for r in snapshot if r["id"] == "busy")
        assert row["state"] in ("starting", "running", "restarting"), row


def _ticker_job(tmp_path, name: str, code: int, restarts: int) -> str:
    path = os.path.join(str(tmp_path), f"{name}.yaml")
    with open(path, "w") as fh:
        json.dump({"name": name, "trainer": "script", "max_restarts": restarts, "restart_backoff_s": 0,
                   "cluster": {"hosts": ["localhost"], "gpus_per_node": 1, "python": sys.executable,
                               "master_port": free_port()},
                   "script": {"path": os.path.join(SCRIPTS, "ticker.py"), "args": ["8", "0.1", str(code)]},
                   "output_dir": str(tmp_path / name)}, fh)
    return path


class _Bursts:
    """20 `ps` readers that each run once per burst, all at once. A burst starts whenever the
    runs' states or attempt counts change (seen in-process, cheaply), so the readers overlap
    every change without spinning: 20 readers in a loop cost 229 s of CPU under load, and the
    load they made slowed the runs they were waiting for."""

    def __init__(self, env: dict):
        self.env, self.cond, self.gen, self.done = env, threading.Condition(), 0, False
        self.seen: list = []
        self.errors: list = []
        self.threads = [threading.Thread(target=self._reader) for _ in range(20)]
        for t in self.threads:
            t.start()

    def fire(self, done: bool = False) -> None:
        with self.cond:
            self.gen, self.done = self.gen + 1, done
            self.cond.notify_all()

    def _reader(self) -> None:
        mine, last = [], 0
        self.seen.append(mine)
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.gen > last)
                last, done = self.gen, self.done
            _ps_once(self.env, mine, self.errors)   # once more after the end: the final states
            if done:
                return

    def join(self) -> None:
        self.fire(done=True)
        for t in self.threads:
            t.join()


def _ps_once(env: dict, mine: list, errors: list) -> None:
    r = subprocess.run([*CLI, "ps", "--json", "--all"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=limit(120))
    if r.returncode != 0:
        errors.append(r.stderr)
        return
    try:
        mine.append(json.loads(r.stdout))
    except ValueError as e:
        errors.append(f"torn output: {e}: {r.stdout[-200:]}")


@pytest.mark.launches
def test_two_runs_change_state_while_20_ps_read(tmp_path, runs):
    bursts = _Bursts(runs.env)
    reg = Registry(os.path.join(runs.home, "runs.db"))
    try:
        bursts.fire()
        ok = runs.detach(tmp_path, json.load(open(_ticker_job(tmp_path, "ok", 0, 0))))
        bad = runs.detach(tmp_path, json.load(open(_ticker_job(tmp_path, "bad", 3, 2))))
        deadline, before = time.monotonic() + limit(300), None
        while time.monotonic() < deadline:
            now = {r.id: (r.state, r.attempts) for r in reg.runs()}
            if now != before:
                bursts.fire()
                before = now
            if all(now.get(i, ("",))[0] in FINAL for i in (ok, bad)):
                break
            time.sleep(0.05)
    finally:
        bursts.join()
    seen, errors = bursts.seen, bursts.errors
    assert sum(map(len, seen)) >= 20 * 3, "too few bursts to have watched the changes"
    assert not errors, errors[:3]
    final = {r["id"]: r for r in runs.ps()}
    assert (final[ok]["state"], final[ok]["exit_code"], final[ok]["attempts"]) == ("succeeded", 0, 1)
    assert (final[bad]["state"], final[bad]["exit_code"], final[bad]["attempts"]) == ("failed", 3, 3)
    assert [a.exit_code for a in runs.attempts(bad)] == [3, 3, 3]
    for run_id in (ok, bad):
        for thread_seen in seen:  # one reader's calls, in the order they ran
            rows = [r for snap in thread_seen for r in snap if r["id"] == run_id]
            assert {r["state"] for r in rows} <= set(STATES)
            # Never back from an end state to an active one; an exit code only once ended.
            ended = [i for i, r in enumerate(rows) if r["state"] in FINAL]
            assert all(r["state"] in FINAL for r in rows[ended[0]:]) if ended else True
            assert all((r["exit_code"] is None) == (r["state"] in ACTIVE) for r in rows)


def test_each_attempt_records_its_hosts_world_and_batch_and_old_databases_gain_the_columns(tmp_path):
    """Issue 29: every attempt's host set, world and batch arithmetic are in the registry
    (beside events.jsonl); a runs.db from before those columns gets them when opened, its
    old rows reading None."""
    import sqlite3
    from launcher.plan.launch_plan import build_plan
    from launcher.record.recorder import _world_and_batch
    from launcher.spec import validate
    from .helpers import seed000, set_path
    path = str(tmp_path / "runs.db")
    old = sqlite3.connect(path)   # the schema as an older mlaunch made it
    old.executescript(
        "CREATE TABLE runs (id TEXT PRIMARY KEY, name TEXT NOT NULL, backend TEXT NOT NULL, hosts TEXT NOT NULL,"
        " spec TEXT NOT NULL, state TEXT NOT NULL, handle TEXT NOT NULL DEFAULT '{}', supervisor_pid INTEGER,"
        " supervisor_start INTEGER, detached INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0,"
        " exit_code INTEGER, log_dir TEXT, output_dir TEXT, resumed_from TEXT, stop_requested INTEGER NOT NULL"
        " DEFAULT 0, created REAL NOT NULL, started REAL, ended REAL);"
        "CREATE TABLE attempts (run_id TEXT NOT NULL, n INTEGER NOT NULL, tag TEXT NOT NULL, state TEXT NOT NULL,"
        " exit_code INTEGER, resumed_from TEXT, log_paths TEXT NOT NULL, started REAL, ended REAL,"
        " PRIMARY KEY (run_id, n));"
        "INSERT INTO attempts VALUES ('r', 0, 'r', 'failed', 1, NULL, '[]', 1.0, 2.0);")
    old.close()
    reg, again = Registry(path), Registry(path)   # the second open finds the columns there
    raw = seed000()
    for k, v in {"cluster.hosts": ["a", "b", "c"], "cluster.gpus_per_node": 2, "batch": {"global": 12, "per_device": 1}}.items():
        set_path(raw, k, v)
    plan = build_plan(validate(raw), run_id="r")
    world, batch = _world_and_batch(plan)
    assert (world, batch) == (6, "global 12 = world 6 × 1 per device × 2 accumulation")
    reg.attempt_started("r", 1, "r.a1", ["/l/node0.log"], "/o/checkpoint-5", ["a", "b", "c"], world, batch)
    first, second = again.attempts("r")
    assert (first.n, first.hosts, first.world, first.batch) == (0, None, None, None)
    assert (second.n, second.hosts, second.world, second.batch, second.resumed_from) == (
        1, ["a", "b", "c"], 6, batch, "/o/checkpoint-5")
    reg.close(), again.close()

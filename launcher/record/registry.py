"""The run registry: one SQLite database of every run and attempt ($MLAUNCH_HOME/runs.db).

Standard library only: `mlaunch ps` reads it without importing the launcher's heavy parts.
Concurrency: WAL (readers never block the writer), one short transaction per change, and
every change is a targeted UPDATE of the columns it owns, so no writer overwrites another's
update; a state change that depends on the current state is a compare-and-set.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass

from . import regguard
from ..errors import UserError

ACTIVE = ("starting", "running", "restarting")
FINAL = ("succeeded", "failed", "stopped", "lost")
STATES = ACTIVE + FINAL
BUSY_TIMEOUT_MS = 30000   # the default; MLAUNCH_REGISTRY_TIMEOUT_S sets it (regguard.timeout_s)
CONSOLE = "console.log"   # the run's terminal stream, in its log directory

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  id TEXT PRIMARY KEY, name TEXT NOT NULL, backend TEXT NOT NULL, hosts TEXT NOT NULL,
  spec TEXT NOT NULL, state TEXT NOT NULL, handle TEXT NOT NULL DEFAULT '{}',
  supervisor_pid INTEGER, supervisor_start INTEGER, detached INTEGER NOT NULL DEFAULT 0,
  attempts INTEGER NOT NULL DEFAULT 0, exit_code INTEGER, log_dir TEXT, output_dir TEXT,
  resumed_from TEXT, stop_requested INTEGER NOT NULL DEFAULT 0,
  created REAL NOT NULL, started REAL, ended REAL, reason TEXT);
CREATE INDEX IF NOT EXISTS runs_name ON runs(name, created);
CREATE INDEX IF NOT EXISTS runs_state ON runs(state);
CREATE TABLE IF NOT EXISTS attempts (
  run_id TEXT NOT NULL, n INTEGER NOT NULL, tag TEXT NOT NULL, state TEXT NOT NULL,
  exit_code INTEGER, resumed_from TEXT, log_paths TEXT NOT NULL, started REAL, ended REAL,
  hosts TEXT, world INTEGER, batch TEXT,
  PRIMARY KEY (run_id, n));
"""
# Columns a runs.db made before them lacks: added when it is opened (NULL in its old rows).
ADDED = (("attempts", "hosts", "TEXT"), ("attempts", "world", "INTEGER"), ("attempts", "batch", "TEXT"),
         ("runs", "reason", "TEXT"), ("attempts", "plan", "TEXT"), ("runs", "plan", "TEXT"),
         ("attempts", "phases", "TEXT"))


_COLUMNS = ("id name backend hosts spec state handle supervisor_pid supervisor_start detached attempts"
            " exit_code log_dir output_dir resumed_from stop_requested created started ended reason plan").split()
_LIST_COLUMNS = ", ".join("NULL" if c in ("spec", "plan") else c for c in _COLUMNS)


def home() -> str:
    """$MLAUNCH_HOME, default ~/.mlaunch."""
    return os.environ.get("MLAUNCH_HOME") or os.path.join(os.path.expanduser("~"), ".mlaunch")


def absolute(path: str | None) -> str | None:
    """A path as the registry stores it: absolute, so that `mlaunch logs/ps/report` find it
    from any directory (resolved against the cwd of the writer, i.e. of `mlaunch submit`)."""
    return os.path.abspath(os.path.expanduser(path)) if path else path


def locate(path: str, what: str) -> str:
    """A stored path, made absolute, if it exists; else LookupError naming it and why.

    Runs recorded by an older mlaunch may hold paths relative to the directory they were
    submitted from: those resolve only from there, and the message says so."""
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(full):
        return full
    if not os.path.isabs(os.path.expanduser(path)):
        raise LookupError(f"{what} {path} was recorded relative to the directory the run was "
                          f"submitted from (an older mlaunch) and is not under {os.getcwd()}; "
                          "run this command from that directory")
    raise LookupError(f"{what} {path} does not exist (deleted or moved?)")


def holder(run_id: str):
    """The run this registry holds under run_id (its name and state), read without writing
    anything (a dry run creates no registry); None where there is none or it cannot be read
    (then the submit itself refuses in its own words)."""
    path = os.path.join(home(), "runs.db")
    if not os.path.isfile(path):
        return None
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
        try:
            row = db.execute("SELECT name, state FROM runs WHERE id=?", (run_id,)).fetchone()
        finally:
            db.close()
    except sqlite3.Error:
        return None
    return Held(*row) if row else None


@dataclass(frozen=True)
class Held:
    """A registered run, as much of it as a refusal names."""

    name: str
    state: str


def console_path(run_id: str) -> str:
    """The run's console log: on this machine, never in output_dir (a refused submit must
    leave output_dir as it was)."""
    return os.path.join(home(), "runs", run_id, CONSOLE)


def _private_home(path: str) -> None:
    """The directory of runs.db: made 0700 when mlaunch creates it (whatever the umask); an
    existing one of this user's made 0700 too (a 0755 MLAUNCH_HOME showed every run's
    console log to the machine); one of another user's refused: they could read, swap or
    remove this user's registry."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        os.makedirs(parent, exist_ok=True)
        os.chmod(parent, 0o700)
        return
    st = os.stat(parent)
    if st.st_uid != os.geteuid() or st.st_mode & 0o1002:   # another's, or shared (/tmp)
        raise UserError(regguard.not_own(parent, st))
    if st.st_mode & 0o077:
        try:
            os.chmod(parent, 0o700)
        except OSError:   # read-only or immutable: check_before_open says so, in one line
            pass


def _private_db(path: str) -> None:
    """runs.db, its -wal and -shm 0600: the registry holds every run's hosts, paths and spec.
    SQLite gives a -wal or -shm it creates later the database file's mode."""
    for name in (path, path + "-wal", path + "-shm"):
        try:
            if os.stat(name).st_mode & 0o077:
                os.chmod(name, 0o600)
        except OSError:   # gone, or an immutable file: nothing mlaunch can change
            pass


@dataclass(frozen=True)
class Run:
    """One row of `runs`, decoded."""

    id: str
    name: str
    backend: str
    hosts: list
    spec: dict | None    # the spec snapshot; None in listings (Registry.runs)
    state: str
    handle: dict
    supervisor_pid: int | None
    supervisor_start: int | None
    detached: bool
    attempts: int
    exit_code: int | None
    log_dir: str | None
    output_dir: str | None
    resumed_from: str | None
    stop_requested: bool
    created: float
    started: float | None
    ended: float | None
    reason: str | None = None   # why the run ended, one line (its run_end event's reason)
    plan: dict | None = None    # the plan it runs (`submit --dry-run --json`'s form); None in listings

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def never_started(self) -> bool:
        """A submit refused before anything started, as an older mlaunch registered it (a
        failed run with no attempt and no log directory): no run, never shown or chosen."""
        return (self.state == "failed" and not self.attempts
                and not (self.log_dir and os.path.isdir(self.log_dir)))

    def public(self) -> dict:
        """The row as `ps --json` shows it: everything but the spec snapshot."""
        d = dict(self.__dict__)
        d.pop("spec")
        d.pop("plan")
        return d


@dataclass(frozen=True)
class Attempt:
    """One row of `attempts`: one launch of the run's nodes."""

    run_id: str
    n: int
    tag: str
    state: str
    exit_code: int | None
    resumed_from: str | None
    log_paths: list
    started: float | None
    ended: float | None
    hosts: list | None = None   # its nodes' hosts, in rank order
    world: int | None = None    # its processes
    batch: str | None = None    # its batch arithmetic: "global G = world W × P per device × A accumulation"
    plan: dict | None = None    # the plan this attempt ran (`submit --dry-run --json`'s form)
    phases: list | None = None  # its phase timeline, [name, start s, seconds] each (record/phases.py)


class Registry:
    """A connection to runs.db; cheap to open, one per process (or thread)."""

    def __init__(self, path: str | None = None):
        self.path = path or os.path.join(home(), "runs.db")
        _private_home(self.path)
        regguard.check_before_open(self.path)
        wait_s = regguard.timeout_s()
        self._db = sqlite3.connect(self.path, timeout=wait_s,
                                   isolation_level=None, check_same_thread=False)
        self._db.execute(f"PRAGMA busy_timeout={int(wait_s * 1000)}")
        if self._db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        if not self._db.execute("SELECT 1 FROM sqlite_master WHERE name='attempts'").fetchone():
            self._db.executescript(_SCHEMA)
        regguard.add_columns(self._db, ADDED)
        _private_db(self.path)
        regguard.mark_created(self.path)

    def close(self) -> None:
        self._db.close()

    def check(self) -> None:
        """SQLite's quick_check of every page: DatabaseError when the file is damaged (a
        write could otherwise land beside pages that no read has touched yet)."""
        rows = [r[0] for r in self._db.execute("PRAGMA quick_check").fetchall()]
        if rows != ["ok"]:
            first = " ".join(rows[0].replace("*** in database main ***", "").split())
            raise sqlite3.DatabaseError(f"database disk image is malformed: {first}")   # one line

    # -- writes: each one short statement (an implicit transaction of its own) --

    def create(self, run_id: str, *, name: str, backend: str, hosts: list, spec: dict,
               detached: bool, supervisor: tuple[int, int | None], log_dir: str | None,
               output_dir: str | None, handle: dict | None = None) -> None:
        """Record a new run in state starting."""
        self._db.execute(
            "INSERT INTO runs (id, name, backend, hosts, spec, state, handle, supervisor_pid,"
            " supervisor_start, detached, log_dir, output_dir, created) VALUES"
            " (?, ?, ?, ?, ?, 'starting', ?, ?, ?, ?, ?, ?, ?)",
            (run_id, name, backend, json.dumps(hosts), json.dumps(spec), json.dumps(handle or {}),
             supervisor[0], supervisor[1], int(detached), absolute(log_dir), absolute(output_dir),
             time.time()))

    def attempt_started(self, run_id: str, n: int, tag: str, log_paths: list[str],
                        resumed_from: str | None, hosts: list | None = None,
                        world: int | None = None, batch: str | None = None,
                        plan: dict | None = None) -> None:
        """Attempt n has started on every node: the run is running."""
        now = time.time()
        with self._tx():
            self._db.execute(
                "INSERT OR REPLACE INTO attempts (run_id, n, tag, state, resumed_from, log_paths,"
                " started, hosts, world, batch, plan) VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?)",
                (run_id, n, tag, resumed_from, json.dumps([absolute(p) for p in log_paths]), now,
                 json.dumps(hosts) if hosts is not None else None, world, batch,
                 json.dumps(plan) if plan is not None else None))
            self._db.execute(
                "UPDATE runs SET state='running', attempts=?, started=COALESCE(started, ?),"
                " resumed_from=COALESCE(?, resumed_from) WHERE id=? AND state IN"
                " ('starting', 'restarting')", (n + 1, now, resumed_from, run_id))

    def attempt_ended(self, run_id: str, n: int, code: int, state: str) -> None:
        self._db.execute("UPDATE attempts SET state=?, exit_code=?, ended=? WHERE run_id=? AND n=?",
                         (state, code, time.time(), run_id, n))

    def set_phases(self, run_id: str, n: int, phases: list) -> None:
        """Attempt n's phase timeline once it has ended (record/phases.py's stored())."""
        self._db.execute("UPDATE attempts SET phases=? WHERE run_id=? AND n=?",
                         (json.dumps(phases), run_id, n))

    def set_state(self, run_id: str, state: str, *, only_from: tuple[str, ...] = ACTIVE,
                  exit_code: int | None = None, reason: str | None = None) -> bool:
        """Compare-and-set: move the run to state if it is in one of only_from (reason: why
        it ended, kept unless given)."""
        assert state in STATES, state
        ended = time.time() if state in FINAL else None
        marks = ",".join("?" * len(only_from))
        cur = self._db.execute(
            f"UPDATE runs SET state=?, exit_code=COALESCE(?, exit_code), ended=COALESCE(?, ended),"
            f" reason=COALESCE(?, reason) WHERE id=? AND state IN ({marks})",
            (state, exit_code, ended, reason, run_id, *only_from))
        return cur.rowcount == 1

    def set_hosts(self, run_id: str, hosts: list) -> None:
        """The run's hosts once known (a scheduler's allocation names them only when it starts)."""
        self._db.execute("UPDATE runs SET hosts=? WHERE id=?", (json.dumps(hosts), run_id))

    def set_plan(self, run_id: str, plan: dict) -> None:
        """The plan the run's attempts run, once final (after preflight)."""
        self._db.execute("UPDATE runs SET plan=? WHERE id=?", (json.dumps(plan), run_id))

    def set_handle(self, run_id: str, handle: dict) -> None:
        self._db.execute("UPDATE runs SET handle=? WHERE id=?", (json.dumps(handle), run_id))

    def forget(self, run_id: str) -> None:
        """Remove a run that never started (a refused submit: issue 56): not a run, so `ps`
        never lists it and a job name never resolves to it."""
        with self._tx():
            self._db.execute("DELETE FROM attempts WHERE run_id=?", (run_id,))
            self._db.execute("DELETE FROM runs WHERE id=? AND attempts=0", (run_id,))

    def request_stop(self, run_id: str) -> None:
        self._db.execute("UPDATE runs SET stop_requested=1 WHERE id=?", (run_id,))

    # -- reads --

    def get(self, run_id: str) -> Run | None:
        # by name: a column a newer mlaunch adds never shifts what this one reads
        row = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM runs WHERE id=?", (run_id,)).fetchone()
        return self._run(row) if row else None

    def runs(self, include_final: bool = True, limit: int | None = None) -> list[Run]:
        """Newest first."""
        where = "" if include_final else f"WHERE state IN {ACTIVE + ('lost',)!r}"
        # Without the spec snapshot (`ps` never shows it): a listing of 1,000 runs stays fast.
        sql = f"SELECT {_LIST_COLUMNS} FROM runs {where} ORDER BY created DESC"
        rows = self._db.execute(sql + (f" LIMIT {int(limit)}" if limit else "")).fetchall()
        return [self._run(r) for r in rows]

    def attempts(self, run_id: str) -> list[Attempt]:
        rows = self._db.execute("SELECT run_id, n, tag, state, exit_code, resumed_from, log_paths,"
                                " started, ended, hosts, world, batch, plan, phases FROM attempts"
                                " WHERE run_id=? ORDER BY n", (run_id,)).fetchall()
        return [Attempt(*r[:6], json.loads(r[6]), *r[7:9], r[9] and json.loads(r[9]), *r[10:12],
                        r[12] and json.loads(r[12]), r[13] and json.loads(r[13])) for r in rows]

    def resolve(self, ref: str) -> Run | None | list[str]:
        """RUN as the user typed it: a unique id prefix, or a job name (its latest run).

        Returns the run, None when nothing matches, or the ids when the prefix is ambiguous.
        """
        exact = self.get(ref)
        if exact:
            return exact
        # substr, not LIKE: LIKE ignores ASCII case, and `stop LK1` stopped run lk1.
        ids = [r[0] for r in self._db.execute(
            "SELECT id FROM runs WHERE substr(id, 1, ?) = ? ORDER BY created DESC LIMIT 11",
            (len(ref), ref)).fetchall()]
        for (named,) in self._db.execute("SELECT id FROM runs WHERE name=? ORDER BY created DESC",
                                         (ref,)).fetchall():
            run = self.get(named)
            if run is not None and not run.never_started:   # a refused submit is no run
                return run
        if len(ids) == 1:
            return self.get(ids[0])
        return ids or None

    def _run(self, row: tuple) -> Run:
        r = list(row)
        r[3], r[6] = json.loads(r[3]), json.loads(r[6])
        r[4] = json.loads(r[4]) if r[4] is not None else None
        r[20] = json.loads(r[20]) if r[20] is not None else None
        r[9], r[15] = bool(r[9]), bool(r[15])
        return Run(*r)

    def _tx(self):
        return _Immediate(self._db)


class _Immediate:
    """BEGIN IMMEDIATE ... COMMIT: a multi-statement change, taking the write lock up front."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def __enter__(self):
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, et, ev, tb):
        self._db.execute("COMMIT" if et is None else "ROLLBACK")

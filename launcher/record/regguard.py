"""The run registry's failures, each told in one line with the file and the fix, and writes
that wait out another writer's lock instead of failing a run.

A zero-byte runs.db is told apart from a new one by a marker written beside it once the
registry has its tables (runs.db.created): SQLite would silently start an empty registry
over a truncated file, and every run would vanish from `ps`. Standard library only.
"""
from __future__ import annotations

import os
import sqlite3
import sys
import time
from typing import Callable, TypeVar

from ..errors import UserError

T = TypeVar("T")
MARKER = ".created"          # beside runs.db: the registry was created, so it is never empty
DEFAULT_TIMEOUT_S = 30.0
BACKOFF_MAX_S = 5.0


def timeout_s() -> float:
    """How long one statement waits for another writer's lock (MLAUNCH_REGISTRY_TIMEOUT_S)."""
    try:
        return max(0.0, float(os.environ.get("MLAUNCH_REGISTRY_TIMEOUT_S", DEFAULT_TIMEOUT_S)))
    except ValueError:
        return DEFAULT_TIMEOUT_S


def check_before_open(path: str) -> None:
    """Refuse a truncated registry and a directory mlaunch cannot write, before SQLite
    opens (and would recreate, or half-open) the file."""
    if os.path.exists(path) and os.path.getsize(path) == 0 and os.path.exists(path + MARKER):
        raise UserError(f"run registry {path}: truncated to 0 bytes (it held runs: {path}{MARKER} "
                        f"exists); restore it from a backup, or remove both files to start an "
                        "empty registry")
    folder = os.path.dirname(path)
    for what in (folder, path):
        if os.path.exists(what) and not os.access(what, os.W_OK):
            raise UserError(_read_only(path, what))


def mark_created(path: str) -> None:
    """The registry has its tables: from now on an empty runs.db means a truncated one."""
    try:
        fd = os.open(path + MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:   # marked already, or by a concurrent first command (20 `ps` at once)
        return
    with os.fdopen(fd, "w") as fh:
        fh.write("mlaunch: runs.db beside this file was created with its tables; "
                 "a zero-byte runs.db is a truncated one\n")


def locked(exc: BaseException) -> bool:
    """Is exc SQLite's "another connection holds the lock" (after the busy timeout)?"""
    return isinstance(exc, sqlite3.OperationalError) and any(
        w in str(exc) for w in ("locked", "busy"))


def explain(path: str, exc: BaseException) -> UserError:
    """The one line for exc raised while using the registry at path."""
    text = str(exc)
    if locked(exc):
        return UserError(f"run registry {path}: locked by another process for over "
                         f"{timeout_s():g} s ({text}); try again once it is free, or set "
                         "MLAUNCH_REGISTRY_TIMEOUT_S to wait longer")
    if isinstance(exc, sqlite3.DatabaseError) and any(
            w in text for w in ("not a database", "malformed", "corrupt")):
        return UserError(f"run registry {path}: damaged ({text}); move it aside (mv {path} "
                         f"{path}.damaged) and recover what you can with `sqlite3 {path}.damaged "
                         ".recover`, or set MLAUNCH_HOME to another directory")
    folder = os.path.dirname(path)
    for what in (folder, path):
        if os.path.exists(what) and not os.access(what, os.W_OK):
            return UserError(_read_only(path, what))
    return UserError(f"run registry {path}: {text}; check the file and its directory, or set "
                     "MLAUNCH_HOME to a writable directory")


def not_own(folder: str, st: os.stat_result) -> str:
    """The line for a registry directory that is not this user's alone."""
    import pwd
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = f"uid {st.st_uid}"
    why = (f"belongs to {owner}, not to you" if st.st_uid != os.geteuid()
           else f"is shared (mode {st.st_mode & 0o7777:o}), not yours alone")
    return (f"run registry {folder}/runs.db: its directory {folder} {why}: whoever else can write "
            "there can read, swap or remove your runs; set MLAUNCH_HOME to a directory of your own")


def _read_only(path: str, what: str) -> str:
    kind = "directory" if os.path.isdir(what) else "file"
    return (f"run registry {path}: its {kind} {what} is not writable (read-only or immutable); "
            f"make it writable (chmod u+w, chattr -i, or remount) or set MLAUNCH_HOME to a "
            "writable directory")


def patiently(fn: Callable[..., T], *args, notice: Callable[[str], None] | None = None,
              path: str = "runs.db", **kw) -> T:
    """fn(*args, **kw), retried with backoff for as long as another writer holds the lock:
    a run's progress is recorded late rather than lost, and never fails the run."""
    delay, told = 0.05, False
    while True:
        try:
            return fn(*args, **kw)
        except sqlite3.OperationalError as e:
            if not locked(e):
                raise
            if not told:
                told = True
                (notice or _stderr)(f"run registry {path} is locked by another process; "
                                    "retrying until it is free (the run goes on)")
        time.sleep(delay)
        delay = min(delay * 2, BACKOFF_MAX_S)


def _stderr(line: str) -> None:
    print(f"mlaunch: {line}", file=sys.stderr, flush=True)


def add_columns(db: sqlite3.Connection, added: tuple) -> None:
    """Add the columns (table, column, type) of `added` that a runs.db made by an older
    mlaunch lacks (another process may add one at the same moment: its "duplicate column"
    is this one's success)."""
    have = {(t, r[1]) for t in {t for t, _, _ in added}
            for r in db.execute(f"PRAGMA table_info({t})").fetchall()}
    for table, column, kind in added:
        if (table, column) not in have:
            try:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            except sqlite3.OperationalError as e:
                if "duplicate column" not in str(e):
                    raise

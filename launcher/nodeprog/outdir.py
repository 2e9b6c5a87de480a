"""The run lock in output_dir. Standard library only: this file's source is also run on the
master node (`python3 - lock|unlock|touch OUTPUT_DIR ...`), where output_dir lives.

The lock holds the launcher's host, pid and run id. A second concurrent submit on the same
output_dir is refused; a lock whose launcher is gone can be taken over: its pid is dead
(checked when the launcher host is this one) or its heartbeat is older than STALE_AFTER_S.
"""
from __future__ import annotations

import json
import os
import stat
import sys
import time

LOCK_NAME = ".mlaunch.lock"
STALE_AFTER_S = 120.0  # the launcher refreshes the lock every HEARTBEAT_S while it runs
HEARTBEAT_S = 30.0
LOCK_CAP = 64 << 10   # a lock is one short JSON line


def lock(output_dir: str, host: str, pid: int, run_id: str, now: float | None = None) -> dict:
    """Take the lock; returns {"ok": bool, "holder": {...}, "took_over": bool, "why": str}.
    The lock names the folders it had to make for output_dir (unlock's drop removes them)."""
    made = _missing(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LOCK_NAME)
    mine = {"host": host, "pid": pid, "run_id": run_id, "started": now or time.time(), "made": made}
    why = ""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read(path)
            stale = _stale(path, holder, host, now or time.time())
            if not stale:
                return {"ok": False, "holder": holder, "took_over": False, "why": ""}
            os.replace(path, path + ".stale")  # kept, never deleted: evidence of the crash
            why = stale
            continue
        with os.fdopen(fd, "w") as fh:
            json.dump(mine, fh)
        return {"ok": True, "holder": mine, "took_over": bool(why), "why": why}
    return {"ok": False, "holder": _read(path), "took_over": False, "why": "lock contention"}


def unlock(output_dir: str, run_id: str, drop: bool = False) -> bool:
    """Remove the lock if (and only if) this run holds it. drop: a submit refused before
    anything ran also removes the folders its lock made, where they are still empty."""
    # Only output_dir and its parents, whatever the lock file says: it names what to remove.
    ours = set(_lineage(output_dir))
    made = [d for d in _read(os.path.join(output_dir, LOCK_NAME)).get("made") or [] if d in ours]
    if not _if_held(output_dir, run_id, os.remove):
        return False
    for d in made if drop else []:   # deepest first
        try:
            os.rmdir(d)
        except OSError:
            break
    return True


def _lineage(output_dir: str) -> list[str]:
    """output_dir and every parent of it, deepest first (absolute)."""
    out, d = [], os.path.abspath(output_dir)
    while d != os.path.dirname(d):
        out.append(d)
        d = os.path.dirname(d)
    return out


def _missing(output_dir: str) -> list[str]:
    """output_dir and each of its parents that does not exist yet, deepest first."""
    out = []
    for d in _lineage(output_dir):
        if os.path.lexists(d):
            break
        out.append(d)
    return out


def touch(output_dir: str, run_id: str) -> bool:
    """Heartbeat: refresh the lock's mtime while this run holds it."""
    return _if_held(output_dir, run_id, os.utime)


def _if_held(output_dir: str, run_id: str, act) -> bool:
    """act(lock path) when run run_id holds output_dir's lock; whether it did."""
    path = os.path.join(output_dir, LOCK_NAME)
    if _read(path).get("run_id") != run_id:
        return False
    act(path)
    return True


def _read(path: str) -> dict:
    """The lock's JSON object; {} where it is anything but this run's kind of file: a link
    (never followed: another user's `ln -s /dev/zero .mlaunch.lock` must not fill memory), a
    FIFO (opened without blocking), a device, or over LOCK_CAP bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return {}
            data = json.loads(fh.read(LOCK_CAP))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _stale(path: str, holder: dict, host: str, now: float) -> str:
    """Why the lock's launcher is known to be gone, or "" if it may still be running."""
    if holder.get("host") == host and isinstance(holder.get("pid"), int) and not _alive(holder["pid"]):
        return f"launcher pid {holder['pid']} on {host} is gone"
    try:
        age = now - os.lstat(path).st_mtime
    except OSError:
        return "lock vanished"
    if age > STALE_AFTER_S:
        return f"no heartbeat for {age:.0f}s"
    if not holder:
        return "unreadable lock"
    return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str] | None = None) -> int:
    """CLI for remote use; prints one JSON object."""
    args = sys.argv[1:] if argv is None else argv
    op, output_dir = args[0], args[1]
    if op == "lock":
        out = lock(output_dir, args[2], int(args[3]), args[4])
    elif op == "unlock":
        out = {"ok": unlock(output_dir, args[2], drop=args[3:] == ["drop"])}
    else:
        out = {"ok": touch(output_dir, args[2])}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

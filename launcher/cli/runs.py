"""`mlaunch ps / logs / stop / attach`: registered runs, from any terminal.

`ps` stays fast: it reads the registry and checks pid markers in /proc; no SSH, no
fabric, no spec models on that path.
"""
from __future__ import annotations

import functools
import json
import re
import sys
import time

import click

from ..errors import UserError
from .logview import refresh



# A RUN argument can only name a run by these characters (run ids and job names have no
# others); anything else, or longer, matches nothing and never reaches SQLite.
RUN_ARG = re.compile(r"^[A-Za-z0-9._-]{0,128}$")
MIN_PREFIX = 3   # `stop` of a shorter prefix (or of "") is refused: too easy to hit a neighbour


def _registry():
    """The registry, whole: a damaged page that the listing's query would skip (`ps`
    printed an empty list, exit 0) is one line and exit 2, as a damaged header is."""
    import sqlite3

    from ..record.registry import Registry, home
    try:
        reg = Registry()
        reg.check()
        return reg
    except (sqlite3.Error, OSError) as e:
        from ..record.regguard import explain
        raise explain(f"{home()}/runs.db", e) from None


def registry_errors(cmd):
    """A registry that is locked, damaged, read-only or truncated: one line, exit 2."""
    @functools.wraps(cmd)
    def wrapper(*args, **kw):
        import sqlite3

        from ..record.registry import home
        try:
            return cmd(*args, **kw)
        except sqlite3.Error as e:
            from ..record.regguard import explain
            raise explain(f"{home()}/runs.db", e) from None
    return wrapper


def _backend(run):
    from ..backends import backend_for
    return backend_for(run.backend)


def _shown(ref: str) -> str:
    return repr(ref if len(ref) <= 60 else ref[:57] + "...")


def _resolve(reg, ref: str, destructive: bool = False):
    """RUN as typed: the run, or UserError naming why not (and the candidates)."""
    if not RUN_ARG.fullmatch(ref):
        raise UserError(f"RUN {_shown(ref)}: not a run id or job name (1-128 letters, digits, "
                        "'.', '_', '-'); see `mlaunch ps --all` for the runs")
    found = reg.resolve(ref) if ref else [r.id for r in reg.runs()] or None
    if destructive and not isinstance(found, list):
        found = _unambiguous(reg, ref, found)
    if isinstance(found, list) and len(ref) < MIN_PREFIX:
        more = ", ".join(found[:10]) + (", ..." if len(found) > 10 else "")
        raise UserError(f"RUN {_shown(ref)}: too short to pick one run (candidates: {more}); "
                        f"give at least {MIN_PREFIX} characters of the id, or the job name")
    if found is None:
        raise UserError(f"RUN {_shown(ref)}: no run with this id prefix or job name; see `mlaunch ps --all`")
    if isinstance(found, list):
        more = ", ".join(found[:10]) + (", ..." if len(found) > 10 else "")
        raise UserError(f"RUN {_shown(ref)}: matches several runs ({more}); give more of the id")
    return refresh(reg, found)


def _unambiguous(reg, ref: str, found):
    """For `stop`: a short prefix, or a job name with several active runs, is ambiguous
    (the candidates as a list); an exact id, a longer unique prefix or a name stay found."""
    if found is not None and found.id == ref:
        return found
    if found is not None and found.name == ref:
        active = [r.id for r in reg.runs(include_final=False) if r.name == ref and r.active]
        return active if len(active) > 1 else found
    if len(ref) < MIN_PREFIX:
        return [r.id for r in reg.runs() if r.id.startswith(ref)] or None
    return found


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


@click.command()
@click.argument("run", required=False)
@click.option("--all", "show_all", is_flag=True, help="Also runs that have ended.")
@click.option("--json", "as_json", is_flag=True, help="One JSON list on stdout.")
@registry_errors
def ps(run: str | None, show_all: bool, as_json: bool) -> None:
    """List runs: active ones (and lost ones), or every run with --all.

    With RUN, that run, why it ended, and each node's last state, step and GPU (or CPU) sample. RUN is a run
    id, a unique prefix of one, or a job name (its latest run), as `mlaunch
    ps --all` lists them."""
    reg = _registry()
    if run is not None:
        return _ps_one(_resolve(reg, run), as_json)
    runs = [refresh(reg, r) for r in reg.runs(include_final=show_all) if not r.never_started]
    if not show_all:
        # A lost run is listed until someone has stopped it (its nodes swept).
        runs = [r for r in runs if r.active or (r.state == "lost" and not r.stop_requested)]
    if as_json:
        click.echo(json.dumps([r.public() for r in runs], indent=None))
        return
    _table(runs)


def _ps_one(r, as_json: bool) -> None:
    from ..view.nodeview import read_snapshot, status_lines
    from ..record import runevents
    from ..record.registry import locate
    log_dir, gone = None, None
    try:
        log_dir = locate(r.log_dir, "log dir") if r.log_dir else None
    except LookupError as e:
        gone = str(e)
    snap = read_snapshot(log_dir)
    rows = _registry().attempts(r.id)
    events = runevents.read(log_dir) if log_dir else []
    changes = _with_world(runevents.attempt_lines(events), rows)
    copies = runevents.copies_lines(events)
    if as_json:
        click.echo(json.dumps({**r.public(), "live": snap, "attempts": changes, "checkpoint_copies": copies,
                               "attempt_rows": [a.__dict__ for a in rows],
                               "phase_lines": _phase_lines(r, log_dir)}))
        return
    _table([r])
    if r.reason:   # why it ended: its run_end event's reason, or the refusal before any attempt
        click.echo(f"ended: {r.reason}")
    for line in _phase_lines(r, log_dir):   # the phase going on, and one far slower than last run's
        click.echo(line)
    if changes:   # which hosts each attempt ran on, and why that changed
        click.echo("\n".join(["", "attempts:"] + [f"  {line}" for line in changes]))
    if copies:   # checkpoints: {replicas: N}: where each part of the newest checkpoints is
        click.echo("\n".join(["", "checkpoint copies:"] + [f"  {line}" for line in copies]))
    if gone:   # before the first attempt no log dir exists yet: no cause for alarm
        click.echo("no node samples yet: no node has started" if r.active and not rows
                   else f"no node samples: {gone}")
        return
    if snap is None:
        click.echo(f"no node samples in {log_dir} (health.sample_every_s: 0, or none yet)")
        return
    click.echo("")
    click.echo("\n".join(status_lines(snap, 200, age_s=max(0.0, time.time() - snap["time"]))))


def _phase_lines(r, log_dir: str | None) -> list[str]:
    """view/timeline.py's ps lines for a run: its phase now (while it is active) and a
    warning per phase more than twice as long as in the job's previous run."""
    from datetime import datetime, timezone
    from ..record import runevents
    from ..view import timeline
    from ..record import phases
    events = runevents.read(log_dir) if log_dir else []
    if not any(e.get("event") == phases.PHASE for e in events):   # not started: connect, preflight...
        events = phases.pending_events(r.handle.get("pending") if isinstance(r.handle, dict) else None)
    if not events:
        return []
    before, previous = _previous_phases(_registry(), r)
    now = datetime.now(timezone.utc) if r.active else None
    return timeline.ps_lines(events, now, previous, before)


def _previous_phases(reg, r) -> tuple[str, list[tuple[str, float]]]:
    """The job's previous run to hold this one's phases against, and its phases: the newest
    earlier run of the same name, backend and node count whose first attempt has its phases
    stored (a run lost, refused, stopped before its start, or still going has none: the one
    before it counts); ("", []) when there is none."""
    for p in reg.runs():   # newest first
        if p.name != r.name or p.created >= r.created or p.backend != r.backend or len(p.hosts) != len(r.hosts):
            continue
        first = next((a for a in reg.attempts(p.id) if a.n == 0), None)
        if first is not None and first.phases:
            return p.id, [(name, secs) for a in reg.attempts(p.id) for name, _, secs in (a.phases or [])]
    return "", []


def _with_world(lines: list[str], rows) -> list[str]:
    """Each attempt's node line with the world and batch arithmetic the registry holds."""
    import re
    by_n = {a.n: a for a in rows}
    out = []
    for line in lines:
        m = re.match(r"attempt (\d+): \d+ nodes: ", line)
        a = by_n.get(int(m.group(1))) if m else None
        out.append(line + (f"; world {a.world}" if a and a.world else "")
                   + (f"; batch {a.batch}" if a and a.batch else ""))
    return out


def _table(runs) -> None:
    now = time.time()
    rows = [("ID", "NAME", "STATE", "NODES", "AGE", "ATTEMPTS", "EXIT")]
    rows += [(r.id, r.name, r.state, str(len(r.hosts)), _age(now - r.created), str(r.attempts),
              "" if r.exit_code is None else str(r.exit_code)) for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    click.echo("\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows))


@click.command()
@click.argument("run")
@click.option("--node", type=int, help="Node K's log (default: the run's console stream).")
@click.option("--attempt", type=int, help="Attempt N (default: the latest).")
@click.option("-f", "--follow", is_flag=True, help="Follow until the run ends; exit with its code.")
@click.option("--tail", type=click.IntRange(0), help="Only the last N lines first.")
@registry_errors
def logs(run: str, node: int | None, attempt: int | None, follow: bool, tail: int | None) -> None:
    """Print a run's logs: its console stream, or one node's log with --node.

    RUN is a run id, a unique prefix of one, or a job name (its latest run), as `mlaunch
    ps --all` lists them."""
    from .logview import View
    reg = _registry()
    r = _resolve(reg, run)
    view = View(reg, r, node, attempt, wait=follow)
    view.show(tail)
    if follow:
        sys.exit(view.follow())


@click.command()
@click.argument("run")
@registry_errors
def attach(run: str) -> None:
    """Stream a running run live; Ctrl-C detaches and leaves it running.

    RUN is a run id, a unique prefix of one, or a job name (its latest run), as `mlaunch
    ps --all` lists them."""
    from .logview import View
    reg = _registry()
    r = _resolve(reg, run)
    if not r.active:
        raise UserError(f"run {r.id} is {r.state}, not running; see `mlaunch logs {r.id}`")
    click.echo(f"[mlaunch] attached to run {r.id}: Ctrl-C detaches, the run keeps running "
               f"(stop it with `mlaunch stop {r.id}`)", err=True)
    view = View(reg, r, None, None, wait=True)
    view.live()
    try:
        view.show(40)
        code = view.follow()
    except KeyboardInterrupt:
        view.printer.set_status(None)
        click.echo(f"\n[mlaunch] detached from run {r.id}; it keeps running", err=True)
        sys.exit(0)
    sys.exit(code)


@click.command()
@click.argument("run")
@click.option("--kill", "--force", "force", is_flag=True,
              help="SIGKILL every process at once instead of TERM, a grace period, then KILL.")
@registry_errors
def stop(run: str, force: bool) -> None:
    """Stop a run from any terminal (its processes only); exit 0 when none is left anywhere.

    RUN is a run id, a unique prefix of one, or a job name (its latest run), as `mlaunch
    ps --all` lists them."""
    reg = _registry()
    r = _resolve(reg, run, destructive=True)
    result = _backend(r).cancel(r, force=force)
    for line in result.problems:
        click.echo(f"mlaunch: {line}", err=True)
    left = sum(result.left.values())
    if r.state == "lost":
        _stopped_after_lost(reg, r, result, left)
    final = reg.get(r.id)
    state = "lost, now stopped" if final.state == "lost" and final.stop_requested else final.state
    click.echo(f"[mlaunch] run {r.id}: {result.how}; {state}; "
               f"{left} process{'' if left == 1 else 'es'} left on {len(result.left)} "
               f"host{'' if len(result.left) == 1 else 's'}")
    sys.exit(0 if result.clean else 1)


def _stopped_after_lost(reg, r, result, left: int) -> None:
    """A lost run keeps what was recorded (state lost, its end, no exit code): the stop is
    added, as stop_requested and a `stop` event in its events.jsonl."""
    import os

    from ..record.events import EventLog
    reg.request_stop(r.id)
    if not r.log_dir or not os.path.isdir(r.log_dir):
        click.echo(f"mlaunch: run {r.id}: log dir {r.log_dir} is gone; no stop event written", err=True)
        return
    EventLog(os.path.join(r.log_dir, "events.jsonl"), r.id, max(r.attempts - 1, 0)).emit(
        "stop", after="lost", left=left, clean=result.clean)


def register(group: click.Group) -> None:
    """Add the run commands to the mlaunch command group."""
    for cmd in (ps, logs, stop, attach):
        group.add_command(cmd)

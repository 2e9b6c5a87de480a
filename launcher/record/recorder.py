"""What submit tells the run registry as a run goes by, and the run's console log.

The console log ($MLAUNCH_HOME/runs/<run id>/console.log) is the run's terminal stream, exactly as the
foreground shows it (without colour): `mlaunch attach` and `mlaunch logs` read it, so a
detached run looks the same as a foreground one.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Callable, TextIO

from . import fsmode, phases, registry, regguard, runevents
from ..errors import UserError
from ..plan.launch_plan import MASK, LaunchPlan
from ..spec import JobBase
from ..spec.secret_rules import mask_text, secret_env, secret_values

ANSI = re.compile(r"\033\[[0-9;]*m")
STOPPED_EXIT = 130


class Tee:
    """A text stream writing to the terminal (until detached) and to the console log."""

    def __init__(self, primary: TextIO | None, path: str):
        self.primary, self.path = primary, path
        self._file = fsmode.open_private(path, "a", buffering=1)
        self.failed: str | None = None   # why the console log stopped (a full disk), once said

    def _log(self, text: str) -> None:
        """Append to the console log; a log that cannot be written (a full disk) is said once,
        on the terminal, and left: the run goes on without it."""
        if self.failed is not None:
            return
        try:
            self._file.write(text)
        except (OSError, ValueError) as e:
            self._fail(e)

    def _fail(self, e: Exception) -> None:
        self.failed = getattr(e, "strerror", None) or str(e)
        line = f"cannot write the console log {self.path} ({self.failed}); the run goes on without it"
        if self.primary is not None:
            self.terminal_only(f"mlaunch: {line}\n")
        else:
            say(line)

    def write(self, text: str) -> int:
        if self.primary is not None:
            try:
                self.primary.write(text)
                self.primary.flush()
            except (OSError, ValueError):  # the terminal went away: keep the log going
                self.primary = None
        self._log(ANSI.sub("", text))
        return len(text)

    def log_only(self, text: str) -> None:
        self._log(text)

    def terminal_only(self, text: str) -> None:
        """What belongs on the screen and not in the log: the live view's status lines."""
        if self.primary is not None:
            try:
                self.primary.write(text)
            except (OSError, ValueError):
                self.primary = None

    def fileno(self) -> int:
        if self.primary is None:
            raise OSError("no terminal")
        return self.primary.fileno()

    def flush(self) -> None:
        if self.failed is None:
            try:
                self._file.flush()
            except OSError as e:
                self._fail(e)

    def isatty(self) -> bool:
        return bool(self.primary is not None and self.primary.isatty())

    def detach(self) -> None:
        self.primary = None

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:   # the last buffered line on a full disk: already said, or lost
            pass


def spec_snapshot(job: JobBase) -> dict:
    """The spec as validated, secrets masked (it is stored and shown)."""
    data = job.model_dump(mode="json", by_alias=True, exclude_unset=True)
    env = data.get("cluster", {}).get("env", {})
    for k, v in env.items():
        if secret_env(job, k, v):
            env[k] = MASK
    return _masked(data, secret_values(job))


def _masked(value, secrets: tuple[str, ...]):
    """Every string in value with secret values and URL passwords masked (spec_snapshot)."""
    if isinstance(value, str):
        return mask_text(value, secrets, MASK)
    if isinstance(value, dict):
        return {k: _masked(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, secrets) for v in value]
    return value


def check_registry() -> None:
    """Before a submit starts anything: the registry opens, is whole and is writable, else
    UserError with the file and the fix (a damaged one would fail the run's first write)."""
    try:
        reg = registry.Registry()
        try:
            regguard.patiently(reg.check, path=reg.path)
        finally:
            reg.close()
    except (OSError, registry.sqlite3.Error) as e:
        raise regguard.explain(f"{registry.home()}/runs.db", e) from None


class Recorder:
    """Registers one run and its attempts; submit calls it at each step."""

    def __init__(self, *, detached: bool, supervisor: tuple[int, int | None],
                 backend: str, on_detach: Callable[[], None] | None = None):
        self.detached, self.supervisor, self.backend = detached, supervisor, backend
        self.on_detach = on_detach
        self.reg: registry.Registry | None = None
        self.run_id = ""
        self.console: Tee | None = None
        self.reason: str | None = None   # why the run ended (ended_because), stored by end()
        self.unwritable: str | None = None   # why the registry took no write, once it did not
        self._told = False
        self.started_any = False   # an attempt started (or a scheduler queued one)
        self.refused = False       # the submit was refused before anything started: no run
        self.changed = False       # it moved something in output_dir (changed_output): a run after all

    def begin(self, plan: LaunchPlan, job: JobBase, out: TextIO) -> TextIO:
        """Register the run (state starting); return the stream the printer writes to."""
        self.handle = {"backend": self.backend, "run_id": plan.run_id,
                       "pid": self.supervisor[0], "start": self.supervisor[1]}
        self.log_dir = plan.log_dir
        try:
            self.reg = registry.Registry()
            self.run_id = plan.run_id
            regguard.patiently(self.reg.create, plan.run_id, name=job.name, backend=self.backend,
                               hosts=[n.host for n in plan.nodes], spec=spec_snapshot(job),
                               detached=self.detached, supervisor=self.supervisor,
                               log_dir=plan.log_dir, output_dir=job.output_dir, handle=self.handle,
                               notice=self._notice, path=self.reg.path)
        except registry.sqlite3.IntegrityError:
            try:
                other = self.reg.get(plan.run_id)
            except registry.sqlite3.Error:   # locked or damaged: the id is taken all the same
                other = None
            finally:
                self.reg.close()
                self.reg = None
            raise UserError(taken(plan.run_id, other)) from None
        except (OSError, registry.sqlite3.Error) as e:
            self.reg = None
            raise regguard.explain(f"{registry.home()}/runs.db", e) from None
        path = registry.console_path(plan.run_id)
        try:
            fsmode.private_dir(os.path.dirname(os.path.dirname(path)))   # runs/
            fsmode.private_dir(os.path.dirname(path))
            self.console = Tee(out, path)
        except OSError as e:
            self.end(2)
            raise UserError(f"cannot create {path}: {e.strerror}; set MLAUNCH_HOME to a "
                            "writable directory") from None
        return self.console

    def planned(self, data: dict) -> None:
        """The plan that runs now (view/plandata.py's form): the final plan after preflight,
        then each attempt's before it starts. stop reaches the hosts and processes it names."""
        self._write(self.reg.set_plan, self.run_id, data)

    def attempt_started(self, plan: LaunchPlan, attempt: int, resumed_from: str | None,
                        queued: bool = False, handle: dict | None = None,
                        data: dict | None = None) -> None:
        """Every node of this attempt has started; or (queued) a scheduler holds the attempt
        under handle (its job id): `submit -d` returns then. data: the attempt's plan as
        view/plandata.py gives it, recorded with the attempt."""
        self.started_any = True
        if handle:
            # Lists accumulate across attempts (a chained restart's executor starts afresh).
            for k, v in handle.items():
                self.handle[k] = list(dict.fromkeys(self.handle.get(k, []) + v)) if isinstance(v, list) else v
            self._write(self.reg.set_handle, self.run_id, self.handle)
        if not queued:
            self._write(self.reg.set_hosts, self.run_id, [n.host for n in plan.nodes])
            world, batch = _world_and_batch(plan)
            self._write(self.reg.attempt_started, self.run_id, attempt, plan.tag,
                        [n.log_path for n in plan.nodes], resumed_from,
                        [n.host for n in plan.nodes], world, batch, plan=data)
        if attempt == 0 and self.on_detach is not None:
            detach, self.on_detach = self.on_detach, None   # once, at the first of the two
            detach()
            if self.console is not None:
                self.console.detach()

    def attempt_ended(self, attempt: int, code: int, interrupted: bool,
                      events_path: str | None = None) -> None:
        """The attempt's end, and its phases as events_path holds them so far (its last one,
        the nodes reporting their end, counted up to now)."""
        state = "stopped" if interrupted else "succeeded" if code == 0 else "failed"
        self._write(self.reg.attempt_ended, self.run_id, attempt, code, state)
        if events_path:
            try:
                timeline = phases.timeline(runevents.jsonl(events_path), now=phases.now())   # a torn line skipped
            except (OSError, ValueError):   # the record is a convenience: the run goes on
                return
            self._write(self.reg.set_phases, self.run_id, attempt,
                        phases.stored(phases.of_attempt(timeline, attempt)))

    def _write(self, fn, *args, **kw) -> bool:
        """One registry write, waiting out another writer's lock however long it is held:
        the run's record comes late, the run itself never fails for it. A write that cannot
        be made (a full disk, a read-only registry) is said once and skipped: the run goes
        on and keeps its exit code. True when it was made."""
        try:
            regguard.patiently(fn, *args, notice=self._notice, path=self.reg.path, **kw)
            return True
        except (OSError, registry.sqlite3.Error) as e:
            self.unwritable = self.unwritable or str(e)
            if not self._told:
                self._told = True
                self._tell(f"run registry {self.reg.path}: cannot record run {self.run_id} "
                           f"({e}); the run goes on and keeps its exit code")
            return False

    def _tell(self, line: str) -> None:
        """An error line on stderr (the terminal, or supervisor.log once detached) and in the
        console log: whichever of them can still be written."""
        say(line)
        if self.console is not None:
            self.console.log_only(f"mlaunch: {line}\n")

    def _notice(self, line: str) -> None:
        if self.console is not None:
            self.console.write(f"[mlaunch] {line}\n")
        else:
            say(line)

    def pending(self, marks: list) -> None:
        """The phases marked before the run's event log is written ([time, phase] each), kept
        in the run's handle (a field every mlaunch reads as a whole: no new column, which an
        older mlaunch's running supervisor would trip over): `ps RUN` names the one going on
        (a slow connect, a long preflight)."""
        if self.reg is not None:
            self.handle["pending"] = marks
            self._write(self.reg.set_handle, self.run_id, self.handle)

    def changed_output(self) -> None:
        """The run changed output_dir (moved checkpoints aside): its record stays, even when it
        ends before an attempt starts (a refusal is otherwise forgotten)."""
        self.changed = True

    def note(self, lines: list[str]) -> None:
        """Error lines for the console log only (the terminal gets them on stderr)."""
        if self.console is not None:
            self.console.log_only("".join(f"mlaunch: {line}\n" for line in lines))

    def ended_because(self, reason: str) -> None:
        """Why the run ends, for end() to store (`ps RUN` shows it). The first one given is
        kept: the innermost caller (the attempt loop, beside its run_end event) knows best."""
        if self.reason is None:
            self.reason = reason

    def restarting(self) -> None:
        self._write(self.reg.set_state, self.run_id, "restarting", only_from=("running",))

    def end(self, code: int, interrupted: bool = False) -> None:
        """The run is over: its final state and exit code. A refused submit (nothing started)
        is no run: its row and console log are removed; the terminal has said why."""
        if self.reg is None:
            return
        if self.refused and not self.started_any and not self.changed:
            self._forget()
            return
        stopped = interrupted or code == STOPPED_EXIT
        state = "stopped" if stopped else "succeeded" if code == 0 else "failed"
        told, self._told = self._told, True   # a failure here is told by the line below alone
        if not self._write(self.reg.set_state, self.run_id, state,
                           only_from=registry.ACTIVE + ("lost",), exit_code=code, reason=self.reason):
            self._tell(f"run {self.run_id} {state} (exit {code}), not recorded in {self.reg.path} "
                       f"({self.unwritable}); `mlaunch ps` reads its end from "
                       f"{self.log_dir}/events.jsonl")
        self._told = told
        if self.console is not None:
            self.console.close()


    def _forget(self) -> None:
        if self.console is not None:
            self.console.close()
            try:
                os.unlink(self.console.path)
                os.rmdir(os.path.dirname(self.console.path))
            except OSError:   # a supervisor.log beside it, or already gone: left as it is
                pass
        self._write(self.reg.forget, self.run_id)


def say(line: str) -> None:
    """`mlaunch: line` on stderr, unless stderr itself cannot be written (supervisor.log on
    the full disk it reports): the run goes on either way."""
    try:
        print(f"mlaunch: {line}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def taken(run_id: str, other) -> str:
    """The line for a --run-id the registry holds already."""
    by = f" (job {other.name}, {other.state})" if other is not None else ""
    return (f"--run-id {run_id!r}: taken by an earlier run{by} in this registry; pick "
            "another id, or leave --run-id out for a fresh one")


class NullRecorder(Recorder):
    """For callers that register nothing (tests of submit itself, benchmarks)."""

    def __init__(self):
        super().__init__(detached=False, supervisor=(0, None), backend="")

    def begin(self, plan, job, out):
        return out

    def planned(self, data):
        pass

    def attempt_started(self, plan, attempt, resumed_from, queued=False, handle=None, data=None):
        pass

    def attempt_ended(self, attempt, code, interrupted, events_path=None):
        pass

    def restarting(self):
        pass

    def note(self, lines):
        pass

    def changed_output(self):
        pass

    def ended_because(self, reason):
        pass

    def end(self, code, interrupted=False):
        pass


def _world_and_batch(plan: LaunchPlan) -> tuple[int, str | None]:
    """The attempt's processes, and its batch arithmetic when the plan has one."""
    from ..spec.select import world_size
    world = world_size(plan.job)
    b = plan.batch
    if b is None:
        return world, None
    return world, (f"global {world * b.per_device * b.grad_accum} = world {world} × "
                   f"{b.per_device} per device × {b.grad_accum} accumulation")

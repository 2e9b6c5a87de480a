"""`mlaunch submit`: connect, check, guard output_dir, run, and restart from checkpoints."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from . import bare, finished
from . import universal as universal_ckpt
from ..errors import UserError
from ..session.attempt import JobResult
from ..record import phases
from ..record.events import EventLog
from ..watch.health import timeout_notice
from ..logs.stream import Printer
from ..watch.watch import world_size
from ..plan.launch_plan import LaunchPlan
from ..view.plandata import plan_data
from ..view.present import describe_result
from ..record.recorder import NullRecorder, Recorder
from ..spec import JobBase
from ..plan.trainers import TRAINERS
from .outputdir import Claim, Master, clear_way, starting_point


@dataclass(frozen=True)
class SubmitOptions:
    """What the user asked for on the command line."""

    run_id: str | None = None
    log_dir: str | None = None
    resume: str | None = None        # None, "latest" (must exist), "auto" (fresh if none) or a path
    overwrite: bool = False
    max_restarts: int | None = None  # overrides the spec's max_restarts
    preflight: bool = True
    force: bool = False              # launch although the memory estimate says it will not fit
    overridden: tuple = ()           # the spec keys KEY=VALUE set on the command line


# Settings the trainer restores from a checkpoint's optimizer state when it resumes (the HF
# Trainer loads optimizer.pt, whose param_groups hold lr, weight_decay, betas, eps; the LR
# scheduler keeps the saved base learning rate): an override of one of them on a resume would
# be written down and not used, so it is refused with the reason. A new lr_scheduler or warmup
# does take effect (the schedule is made again from the arguments, over the saved base rate).
RESTORED_ON_RESUME = ("training.learning_rate", "passthrough.weight_decay", "passthrough.optim",
                      "passthrough.adam_beta1", "passthrough.adam_beta2", "passthrough.adam_epsilon",
                      "passthrough.optim_args", "passthrough.optim_target_modules")



def run_request(request, opts: SubmitOptions, backend, out: TextIO | None = None,
                recorder: Recorder | None = None) -> int:
    """Run a backend's request (launcher/backends/base.py) to completion, with restarts;
    return its exit code. The request's plan is the dry-run's; it becomes final once, after
    preflight, and every attempt is made from that recorded plan.

    recorder: registers the run and its attempts (the CLI's runs are all registered)."""
    plan = request.plan
    job = plan.job
    check_flags(job, opts)
    rec = recorder or NullRecorder()
    printer = Printer(plan.mask, rec.begin(plan, job, out or sys.stdout))
    code = 1
    try:
        code = _submit(job, opts, plan, printer, rec, backend)
    except BaseException as e:   # the registry says why (the attempt loop may have said it first)
        code, reason = _aborted(e)
        if isinstance(e, UserError):
            rec.note(e.lines())
            rec.refused = True   # a refusal before any attempt started: no run (Recorder.end)
        rec.ended_because(reason)
        raise
    finally:
        rec.end(code)
    return code


def _submit(job: JobBase, opts: SubmitOptions, plan: LaunchPlan, printer: Printer,
            rec: Recorder, backend) -> int:
    # written once the run starts (_attempts): a refusal leaves none; the registry shows them meanwhile
    marks = phases.Pending(rec.pending)
    marks.mark("connect")
    backend.probe_spares(plan, printer)   # a spare that is a node under another name refused; spares probed meanwhile
    executor = backend.connect(plan, warm=True)   # cluster.warm_start: torchrun's imports beside the checks
    try:
        if bare.stages(plan):   # its own bar: a slow copy read as a slow connect
            marks.mark("staging")
        bare.stage(backend, plan, executor, printer)   # staging: before any check reads the model or data
        if opts.preflight and not backend.preflight_at_submit:  # no node exists before the run
            printer.say(backend.no_preflight_note)
        master = Master(plan, executor)
        claim = Claim(master, printer)   # node 0's checkpoint scan and output_dir lock, beside the preflight
        try:
            return _checked(plan, executor, printer, opts, master, claim, rec, backend, marks)
        finally:
            claim.release()
    finally:
        executor.close()


def _checked(plan: LaunchPlan, executor, printer: Printer, opts: SubmitOptions, master: Master,
             claim: Claim, rec: Recorder, backend, marks: phases.Pending) -> int:
    """_submit once connected and staged: the preflight, the final plan, the starting point,
    then the attempts."""
    if opts.preflight and backend.preflight_at_submit:
        marks.mark("preflight")
    report = _preflight(plan, executor, printer) if opts.preflight and backend.preflight_at_submit else None
    versions = report.stack if report else {}
    plan = plan.replanned(job=_plan_batch(plan.given_job, report, opts, printer),
                          transformers=versions.get("transformers"))
    rec.planned(plan_data(plan, backend.name))   # final: what every attempt is made from
    marks.mark("checkpoint")
    master.plan = plan
    resume_from, before = starting_point(plan.job, master, opts, printer, claim)
    if resume_from:   # --resume=auto found one: the same refusal as --resume's
        refuse_restored_overrides(plan.job, opts, f"resume from {resume_from}")
    if resume_from and (done := finished.complete_line(plan.job, master.last)):
        printer.say(done)
        rec.ended_because(done)
        return 0
    # A fresh start (--overwrite, --resume=auto with nothing complete) restarts only
    # from checkpoints this launch wrote, never from an older run's left in output_dir; so does
    # a resume from a named checkpoint (--resume=PATH, a rollback), or from that one again.
    master.ignore = () if resume_from and not named_resume(opts) else before
    claim.locked()
    claim.ran = True
    return _attempts(plan, executor, printer, opts, master, resume_from, rec, backend, marks)


def named_resume(opts: SubmitOptions) -> bool:
    """--resume=PATH: a checkpoint the user named, not the latest one found."""
    return opts.resume not in (None, "latest", "auto")


def check_flags(job: JobBase, opts: SubmitOptions) -> None:
    """The refusals of the options themselves, before anything runs (--dry-run makes them too)."""
    if opts.resume and opts.overwrite:
        raise UserError("--resume and --overwrite contradict each other; pick one")
    _check_resumable(job, opts)
    if opts.resume not in (None, "auto"):   # auto: a fresh start when no checkpoint is found
        refuse_restored_overrides(job, opts, "--resume")


def refuse_restored_overrides(job: JobBase, opts: SubmitOptions, resumed: str) -> None:
    """An override of an optimizer or scheduler setting on a resume: refused, with why (the
    trainer restores them from the checkpoint, so the run would go on with the saved ones)."""
    keys = [k for k in opts.overridden if k in RESTORED_ON_RESUME]
    if keys:
        raise UserError([f"override {k} with {resumed}: the trainer restores its optimizer state (learning "
                         "rate and optimizer settings) from the checkpoint, so training would go on with "
                         "the checkpoint's value and this one would only be written down; drop the "
                         "override to resume, or start a new run with it (--overwrite, or another "
                         "output_dir)" for k in keys])


def check_offline(job: JobBase, opts: SubmitOptions, unasked: str | None = None, shown=None):
    """Everything submit would refuse before it connects, raised as submit raises it: the
    options (check_flags) and a batch that will not fit the GPUs the spec declares
    (cluster.gpu_memory_gb; no --force). validate, plan, render and --dry-run all call this.
    shown(decision): called before refusing (plan prints its estimate first). The decision."""
    from ..plan import batch as batchplan, meminputs
    from ..plan.batch import refuse_unfit
    check_flags(job, opts)
    decision = batchplan.resolve(job, meminputs.inputs(job, unasked=unasked or meminputs.DRY_RUN))
    if shown:
        shown(decision)
    refuse_unfit(decision, opts.force)
    return decision


def _check_resumable(job: JobBase, opts: SubmitOptions) -> None:
    """--resume / --max-restarts N on a job whose checkpoints cannot be resumed: refused."""
    if opts.resume and not TRAINERS[job.trainer].resumable:
        raise UserError(f"--resume needs a trainer that writes checkpoints; trainer {job.trainer} "
                        "does not")
    why = getattr(TRAINERS[job.trainer], "not_resumable", lambda j: None)(job)
    asked = "--resume" if opts.resume else (
        f"--max-restarts {opts.max_restarts}" if opts.max_restarts else None)
    if why and asked:
        raise UserError(f"{asked}: nothing can be resumed: {why}; remove that key or drop {asked}")


def _plan_batch(job: JobBase, report, opts: SubmitOptions, printer: Printer) -> JobBase:
    """The batch numbers from the nodes' GPU memory and model config (refused when they will
    not fit, unless --force): the job with them filled in, for every attempt."""
    from ..plan import batch as batchplan, meminputs
    from ..view import memview
    from ..plan.batch import refuse_unfit
    decision = batchplan.resolve(job, meminputs.inputs(job, report.memory if report else None,
                                                       unasked=meminputs.NO_PREFLIGHT))
    if decision is None:
        return job
    no_gpu = report is not None and not (report.memory or {}).get("gpu_mib")
    if no_gpu and not decision.chosen and not decision.problems:   # CPU nodes: no GPU memory plan
        printer.say(f"batch: per_device {decision.per_device} × grad_accum {decision.grad_accum} "
                    "(the nodes have no GPU: no GPU memory plan)")
    elif decision.chosen or decision.problems or decision.estimate:
        for line in memview.lines(decision):
            printer.say(line)
    refuse_unfit(decision, opts.force)
    return decision.job


def _preflight(plan: LaunchPlan, executor, printer: Printer):
    """The fast checks; a failure stops the launch before anything starts.

    Returns the Report: the versions the nodes run (which decide some rendered trainer
    arguments) and their GPU memory and model config (which decide the batch).
    """
    from ..preflight import run_checks
    report = run_checks(plan, executor, fast_only=True, printer=printer)
    if not report.ok:
        for line in report.table(color=printer.color).splitlines():
            printer.say(line)
        raise UserError("preflight failed (table above); fix it, or skip with --no-preflight")
    return report


def _attempts(plan, executor, printer, opts, master, resume_from, rec, backend,
              marks: phases.Pending | None = None) -> int:
    """The first launch and up to max_restarts relaunches, each resuming from a checkpoint.

    However the run ends (done, failed, out of restarts, a restart refused, Ctrl-C, a bug),
    events.jsonl gets exactly one run_end (code, reason, attempts) and the registry the same
    reason: `ps RUN` says why without anyone reading the console log."""
    events = EventLog(os.path.join(plan.log_dir, "events.jsonl"), plan.run_id)
    events.emit("run_start", job=plan.job.name, nodes=len(plan.nodes), world_size=world_size(plan),
                resume_from=resume_from, backend=backend.name)
    if marks is not None:   # run_start stays the first line; these carry their own earlier times
        marks.flush(events)
    history: list[tuple[int, JobResult, str | None]] = []
    try:
        code, reason = _loop(plan, executor, printer, opts, master, resume_from, rec, events,
                             history, backend)
    except BaseException as e:
        _run_end(events, rec, len(history), *_aborted(e, events.attempt))
        raise
    _run_end(events, rec, len(history), code, reason)
    if len(history) > 1:
        for n, res, start in history:
            printer.say(f"attempt {n}: exit {res.code}" + (f", resumed from {start}" if start else ""))
    return code


def _loop(plan, executor, printer, opts, master, resume_from, rec, events, history,
          backend) -> tuple[int, str]:
    """The attempts themselves (history gets each one): the run's exit code and why it ended.
    Each attempt's plan is the recorded plan made again for that attempt (and its hosts)."""
    job = plan.job
    limit = job.max_restarts if opts.max_restarts is None else opts.max_restarts
    attempt = 0
    notice = timeout_notice(job)
    if notice:
        printer.say(notice)
    first = resume_from   # what this launch resumed (None: a fresh start)
    # --resume on other hosts or GPUs than saved it: converted before attempt 0 (issue 50)
    universal = universal_ckpt.prepare(job, plan, executor, resume_from, printer, events)
    saved_world: dict[str, int] = {}   # checkpoint number -> the world that saved it (bare.copies)
    reached = None   # the highest step any attempt reached
    # no shared disk, a fresh start: the checkpoints the nodes already hold are an earlier run's
    stale = bare.leftovers(plan, executor, printer) if resume_from is None else frozenset()
    while True:
        plan = plan.replanned(job=job, resume_from=resume_from, attempt=attempt, universal=universal,
                              overwrite=_overwrite_why(opts, attempt, resume_from, master))
        data = plan_data(plan, backend.name)
        rec.planned(data)   # before any node starts: stop finds every host this attempt uses
        # A scheduler calls it twice: once queued (its job id), then with the allocated plan.
        started = lambda p=plan, n=attempt, r=resume_from, d=data, **kw: rec.attempt_started(p, n, r, data=d, **kw)  # noqa: E731
        clear_way(plan, master, printer, events, resume_from, rec)   # a save never lands in another world's folder
        # nor on a node's own disk; an earlier run's number moved away is no longer one to shun
        stale = stale - bare.clear_way(plan, executor, printer, events, resume_from, saved_world)
        with bare.copies(plan, executor, printer, events, saved_world, stale):   # checkpoints: {replicas: N}
            result = backend.run_attempt(plan, executor, printer, started)
        rec.attempt_ended(attempt, result.code, result.interrupted, events.path)
        for line in describe_result(plan, result).splitlines():
            printer.say(line)
        history.append((attempt, result, resume_from))
        if result.code == 0 or result.interrupted or attempt >= limit or not result.restartable:
            return result.code, _final_reason(attempt, result, limit)
        attempt += 1
        rec.restarting()
        events.attempt = attempt
        reason = getattr(result.health, "event", None) or _lost_or_exit(result)
        # the step the run had reached (an attempt that failed before its first step, or during
        # its catch-up, does not lower it): where the next attempt's catch-up ends
        reached = max((x for x in (reached, result.last_step) if x is not None), default=None)
        events.emit(phases.PHASE, phase="backoff", reached=reached, cause=reason)
        later = _replaceable(job)
        if not later:
            _back_off(job, printer, attempt, limit)
        events.emit(phases.PHASE, phase="decide")
        hosts = [n.host for n in plan.nodes]
        job, plan, executor = backend.next_attempt(job, plan, executor, result, printer, events)
        if later and [n.host for n in plan.nodes] == hosts:   # the same hosts again: wait
            events.emit(phases.PHASE, phase="backoff")
            _back_off(job, printer, attempt, limit)
        elif later:
            printer.say(f"node failure: restart {attempt}/{limit} now, without the failed node")
        master.executor, master.plan = executor, plan
        if bare.stages(plan):
            events.emit(phases.PHASE, phase="staging")
        bare.stage(backend, plan, executor, printer)   # a spare gets the model, data and code
        events.emit(phases.PHASE, phase="checkpoint")
        if getattr(job, "checkpoints", None):   # no shared disk: the newest checkpoint complete across copies, on every node
            found = bare.newest(plan, executor, printer, master, saved_world, stale)
        else:
            found = master.discover() if TRAINERS[job.trainer].resumable else None
        # nothing newer complete: the checkpoint this launch resumed, again (never a fresh start
        # after a resume, never an older run's checkpoint after --resume=PATH)
        resume_from = (found.latest if found else None) or first
        if found and found.latest and (done := finished.complete_line(job, found)):
            printer.say(f"restart {attempt}/{limit} not needed: {done}")
            return 0, done
        universal = universal_ckpt.prepare(job, plan, executor, resume_from, printer, events)
        if universal and getattr(job, "checkpoints", None):   # node 0 converted it: every node reads the conversion
            bare.spread(plan, executor, printer, resume_from)
        events.emit("restart", reason=reason, limit=limit, resume_from=resume_from)
        printer.say(f"restart {attempt}/{limit}: " + (f"resuming from {resume_from}"
                                                       if resume_from else "no complete checkpoint; fresh start"))


def _replaceable(job: JobBase) -> bool:
    """Whether a failed node may be left out of the next attempt (a spare, or a shrink). Then
    the back-off waits only when the next attempt runs on the same hosts after all: a crash
    may be transient there (a port still held, a file system catching up), while a node that
    was replaced or dropped takes no part, and waiting for it helps nothing."""
    from . import shrink
    return bool(job.cluster.spare_hosts) or shrink.allowed(job)


def _back_off(job: JobBase, printer: Printer, attempt: int, limit: int) -> None:
    """restart_backoff_s, said."""
    printer.say(f"node failure: restart {attempt}/{limit} in {job.restart_backoff_s:g}s")
    time.sleep(job.restart_backoff_s)


def _final_reason(attempt: int, result: JobResult, limit: int) -> str:
    """Why the run ends after this attempt, in one line (run_end's reason)."""
    if result.code == 0:
        return f"attempt {attempt} succeeded: every node exited 0"
    if result.interrupted:
        return f"attempt {attempt} interrupted (Ctrl-C or mlaunch stop)"
    what = f"attempt {attempt} {'timed out' if result.timed_out else 'failed'} ({_cause(result)})"
    if not result.restartable:
        return f"{what}; not restarted: a restart would end the same way"
    return f"{what}; no restart left (max_restarts {limit})"


def _cause(result: JobResult) -> str:
    """What ended an attempt: the scheduler's reason, the health verdict, or the first node
    that failed and how."""
    if result.never_starts:
        return result.never_starts
    if result.health is not None:
        return getattr(result.health, "message", "") or getattr(result.health, "event", "health")
    node = next((n for n in result.nodes if n.rank == result.first_failure), None)
    return f"node{node.rank} {node.host}: {node.result}" if node else f"exit {result.code}"


def reason_of(e: UserError) -> str:
    """A refusal's lines as one reason line (a header ends with ':', its items follow it)."""
    return " ".join(e.lines())


def _aborted(e: BaseException, attempt: int | None = None) -> tuple[int, str]:
    """The exit code and reason of a run ended by an exception outside a running attempt
    (a refusal, a restart's reconnect or conversion refused, Ctrl-C while waiting, a bug)."""
    if isinstance(e, UserError):
        return e.exit_code, reason_of(e)
    if isinstance(e, KeyboardInterrupt):
        return 130, "interrupted (Ctrl-C)" + (f" before attempt {attempt} started"
                                              if attempt is not None else "")
    return 1, f"mlaunch failed: {type(e).__name__}: {e}"


def _run_end(events: EventLog, rec, attempts: int, code: int, reason: str) -> None:
    """The run's one run_end event, and the same reason for the registry."""
    events.emit("run_end", code=code, reason=reason, attempts=attempts)
    rec.ended_because(reason)


def _overwrite_why(opts: SubmitOptions, attempt: int, resume_from: str | None,
                   master: "Master") -> str | None:
    """Why the trainer gets overwrite_output_dir (templates/ says it in the file), or None.

    Whenever output_dir may hold checkpoints mlaunch did not choose, the trainer must not
    pick one itself: LLaMA-Factory would resume from the last one, complete or not.
    """
    if resume_from:   # named below it; overwrite would make LLaMA-Factory delete trainer_log.jsonl
        return None
    if attempt:
        return "restart_fresh"
    if opts.overwrite:
        return "flag"
    return "fresh_over_left" if master.ignore else None


def _lost_or_exit(result: JobResult) -> str:
    """Why the attempt failed, for the restart event: the lost nodes in ssh's words (frozen,
    closed by the host), else the exit code."""
    lost = [f"node{o.rank} {o.host}: {o.exit.detail or 'connection lost'}" for o in result.nodes
            if o.exit is not None and o.exit.lost and not o.terminated]
    return "; ".join(lost) or f"exit {result.code}"

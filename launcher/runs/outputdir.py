"""output_dir, where it lives (node 0): checkpoint discovery, the run's lock, and the
checkpoint a submit starts from."""
from __future__ import annotations

import json
import os
import socket
import sys
import threading

from .. import nodeprog
from ..errors import UserError
from ..logs.stream import Printer
from ..nodeprog import checkpoints, outdir
from ..plan.launch_plan import LaunchPlan, node_python
from ..spec import JobBase
from ..plan.trainers import TRAINERS


def starting_point(job: JobBase, master: "Master", opts, printer: Printer,
                   claim: "Claim | None" = None) -> tuple[str | None, tuple[str, ...]]:
    """The checkpoint to resume from (None: fresh start) and the stamps of every checkpoint
    already in output_dir; refuses to clobber. claim: node 0's scan, already made."""
    if not TRAINERS[job.trainer].resumable:
        if opts.resume:
            raise UserError(f"--resume needs a trainer that writes checkpoints; trainer "
                            f"{job.trainer} does not")
        return None, ()
    from ..spec.lf_rules import resume_refusal
    if opts.resume and resume_refusal(job):
        raise UserError(resume_refusal(job))
    found = claim.found() if claim is not None else master.discover()
    for line in found.explain():
        printer.say(line)
    if opts.resume not in (None, "latest", "auto"):
        return _explicit(job, master, opts.resume, printer), found.stamps
    if opts.resume:
        if found.latest:
            printer.say(f"resuming from {found.latest}")
            return found.latest, found.stamps
        if opts.resume == "auto":
            printer.say(f"no complete checkpoint in {job.output_dir}: starting fresh (--resume=auto)")
            return None, found.stamps
        raise UserError(f"no complete checkpoint in {job.output_dir} to resume from; start fresh "
                        "with `mlaunch submit JOB --resume=auto` (fresh when none is found) or "
                        "`mlaunch submit JOB --overwrite`")
    if found.found_any and not opts.overwrite:
        raise UserError(clobber_line(job.output_dir, found.latest))
    return None, found.stamps


def clobber_line(output_dir: str, latest: str | None = None) -> str:
    """The refusal of a fresh start over checkpoints already in output_dir (submit's, and the
    dry run's where the nodes are this machine)."""
    where = f" (latest complete: {latest})" if latest else ""
    return (f"{output_dir} already holds checkpoints{where}; continue with --resume, or start over "
            "with --overwrite")


def clear_way(plan: LaunchPlan, master: "Master", printer: Printer, events, resume_from: str | None,
              rec=None) -> None:
    """Before an attempt on a shared output_dir: the checkpoint folders it may save into (above
    the step it resumes; all at a fresh start) moved, whole, into output_dir/mlaunch-set-aside/
    (nodeprog/setaside.py says why), one line and a `checkpoints_set_aside` event naming them.
    A move that fails ends the run before the attempt starts (UserError), nothing deleted; the
    run's record is kept once anything moved (rec). Bare nodes (`checkpoints:`) keep their own
    rule for an earlier run's numbers (runs/bare.py)."""
    job, n = plan.job, plan.attempt
    trainer = TRAINERS[job.trainer]
    if not job.output_dir or not trainer.resumable or not trainer.saves_in_output_dir(job) \
            or getattr(job, "checkpoints", None):
        return
    if n == 0 and master.last is not None and not master.last.found_any:
        return   # node 0's scan at this launch saw no checkpoint folder, and output_dir is locked since
    got = master.set_aside(f"{plan.run_id}-attempt{n}", resume_from)
    if got.get("moved"):
        if rec is not None:
            rec.changed_output()
        printer.say(f"output_dir: {', '.join(got['moved'])} moved to {got['to']} before attempt {n}: it "
                    "saves those steps again, and a save never mixes with another world's or run's "
                    "shards; nothing was deleted (remove that folder when you no longer need it)")
        events.emit("checkpoints_set_aside", moved=got["moved"], to=got["to"])
    if got.get("error") and got.get("unreadable"):
        raise UserError(f"output_dir: could not look for checkpoint folders that attempt {n} saves "
                        f"again in {got['unreadable']} ({got['error']}); make it readable and "
                        "writable for this user, then submit again (nothing was moved)")
    if got.get("error"):
        raise UserError(f"output_dir: could not move {got.get('path', job.output_dir)} out of the way of "
                        f"attempt {n}'s saves: {got['error']}; move it out of {job.output_dir} "
                        "yourself (nothing was deleted), then submit again")


def _explicit(job: JobBase, master: "Master", path: str, printer: Printer) -> str:
    """--resume PATH: that checkpoint, checked on node 0 like the automatic choice."""
    named = master.discover(checkpoint=path)
    if not named.latest:
        why = named.skipped[0].reason if named.skipped else "not usable"
        node = master.plan.nodes[0]
        where = f" on node0 {node.host}"
        if not path.startswith(("/", "~")):   # say where a relative PATH was looked for
            cwd = job.cluster.workdir or "the directory each node starts in (the SSH login's home; " \
                                         "this directory for local nodes)"
            where += (f", looked for relative to {cwd}, not output_dir; for the checkpoint of this job "
                      f"give --resume={job.output_dir.rstrip('/')}/{path}")
        raise UserError(f"--resume {path}: {why}{where}; give a complete checkpoint, or --resume to take "
                        f"the latest complete one in {job.output_dir}")
    printer.say(f"resuming from {named.latest} (--resume PATH)")
    return named.latest



class Master:
    """output_dir operations, run where output_dir lives: on node 0."""

    def __init__(self, plan: LaunchPlan, executor):
        self.plan, self.executor = plan, executor
        self.output_dir = plan.job.output_dir
        self.python = node_python(plan.job)   # cluster.python itself, e.g. /usr/bin/python3
        if plan.unheld:  # no node is held: the helpers run on this login node
            self.python = sys.executable
        self._beat: threading.Event | None = None
        self.last: checkpoints.Discovery | None = None   # the latest discover()
        self.ignore: tuple[str, ...] = ()   # checkpoint stamps a restart must not resume from

    def discover(self, checkpoint: str | None = None) -> checkpoints.Discovery:
        job = self.plan.job
        args = [self.output_dir, *TRAINERS[job.trainer].discovery_args(job)]
        args += ["--checkpoint", checkpoint] if checkpoint else []
        if self.ignore:
            args += ["--ignore-json", json.dumps(list(self.ignore))]
        self.last = checkpoints.Discovery.from_json(self._run("checkpoints", args))
        return self.last

    def set_aside(self, tag: str, resume_from: str | None) -> dict:
        """Move the checkpoint folders an attempt resuming resume_from (None: fresh) may save
        into out of its way, on node 0 (launcher/nodeprog/setaside.py); what it did. Each move
        is one rename: many checkpoints take well under _run's minute."""
        args = [self.output_dir, tag] + (["--resume", resume_from] if resume_from else [])
        return json.loads(self._run("setaside", args))

    def lock(self, printer: Printer) -> None:
        if not self.output_dir:
            return
        got = json.loads(self._run("outdir", ["lock", self.output_dir, socket.gethostname(),
                                                     str(os.getpid()), self.plan.run_id]))
        if not got["ok"]:
            h = {k: _said(got["holder"].get(k)) for k in ("run_id", "pid", "host")}
            raise UserError(f"{self.output_dir} is in use by run {h['run_id']} (launcher pid "
                            f"{h['pid']} on {h['host']}); wait for it, or stop it first")
        if got["took_over"]:
            printer.say(f"took over a stale lock in {self.output_dir}: {got['why']}")
        self._beat = threading.Event()
        threading.Thread(target=self._heartbeat, daemon=True).start()

    def unlock(self, drop: bool = False) -> None:
        """Give output_dir back; drop: also the folders the lock made (nothing ran)."""
        if self._beat is not None:
            self._beat.set()
            self._run("outdir", ["unlock", self.output_dir, self.plan.run_id, *(["drop"] if drop else [])],
                      check=False)

    def _heartbeat(self) -> None:
        while not self._beat.wait(outdir.HEARTBEAT_S):
            self._run("outdir", ["touch", self.output_dir, self.plan.run_id], check=False)

    def _run(self, program: str, args: list[str], check: bool = True) -> str:
        script = nodeprog.script(self.python, program, args)
        code, output = self.executor.run(self.plan.nodes[0].login, script, timeout=60)
        if code != 0 and check:
            raise UserError(f"on {self.plan.nodes[0].host}: output_dir helper failed "
                            f"(exit {code}): {output.strip()[-300:]}")
        return output.strip().splitlines()[-1] if output.strip() else ""


class Claim:
    """Node 0's checkpoint scan and the output_dir lock, made in a thread of their own while
    the preflight runs. Both are round trips to node 0 that need nothing the preflight finds;
    made after it, they came one after the other on the path to the first step.

    What they found is used in the order it always was: a failed preflight first, then the
    starting point's refusals (found), then a lock held by another run (locked). release()
    waits for the thread and gives the lock back, however the submit ended; when it was
    refused (nothing ran), with the output_dir folders the lock made."""

    def __init__(self, master: Master, printer: Printer):
        self.master = master
        self.ran = False   # set once the attempts begin
        self._found: checkpoints.Discovery | None = None
        self._errors: dict[str, BaseException] = {}
        self._thread = threading.Thread(target=self._work, args=(printer,), daemon=True)
        self._thread.start()

    def _work(self, printer: Printer) -> None:
        try:
            if TRAINERS[self.master.plan.job.trainer].resumable:
                self._found = self.master.discover()
        except BaseException as e:   # raised where the scan is used (found)
            self._errors["found"] = e
        try:
            self.master.lock(printer)
        except BaseException as e:   # raised where the lock is needed (locked)
            self._errors["lock"] = e

    def found(self) -> checkpoints.Discovery:
        """The scan of output_dir (node 0), or its failure raised here."""
        self._thread.join()
        if "found" in self._errors:
            raise self._errors["found"]
        assert self._found is not None
        return self._found

    def locked(self) -> None:
        """Returns once output_dir is this run's; raises why it is not (another run holds it)."""
        self._thread.join()
        if "lock" in self._errors:
            raise self._errors["lock"]

    def release(self) -> None:
        self._thread.join()
        self.master.unlock(drop=not self.ran)


def _said(value, most: int = 80) -> str:
    """A field of output_dir's lock as the error line shows it: the file is whoever wrote it,
    so no control character or escape sequence reaches the terminal, and no line of pages."""
    text = str(value)
    text = text if text.isprintable() else text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= most else text[:most] + "..."

"""Resuming a ZeRO checkpoint at another data-parallel size (issue 29: ZeRO shrink).

A ZeRO-1/2 checkpoint holds one optimizer shard per rank of the world that saved it. Before
an attempt at another world (a shrink), node 0 (under Slurm: a one-node job) converts it once to DeepSpeed's universal
checkpoint (ds_to_universal, beside the original in the checkpoint directory, marked complete
only after its files are checked: templates/universal.sh.j2), and the attempt's ds_config gets
checkpoint.load_universal, through which the HF Trainer's engine.load_checkpoint reads it.
"""
from __future__ import annotations

from .. import render
from ..errors import UserError
from ..execute.stream import Printer
from ..plan.launch_plan import LaunchPlan, remote_bin, remote_python
from ..record.events import EventLog
from ..spec import JobBase, world_size

CONVERT_TIMEOUT_S = 3600.0   # a 70B model's fp32 states are hundreds of GB to rewrite
TICK_S = 30.0                # a line this often while it runs: the console is not silent for minutes


def needed(job: JobBase, resume_from: str | None) -> bool:
    """Whether this job's restarts may resume a ZeRO checkpoint at another world (min_nodes)."""
    return bool(resume_from and getattr(job, "deepspeed", None) and job.cluster.min_nodes)


def prepare(job: JobBase, plan: LaunchPlan, executor, resume_from: str | None,
            printer: Printer, events: EventLog) -> bool:
    """Whether the next attempt loads the universal checkpoint: converts resume_from on node 0
    when it was saved at another world; UserError (the run ends) when that fails."""
    if not needed(job, resume_from):
        return False
    node, world = plan.nodes[0], world_size(job)
    script = render.universal_script(node.env, remote_bin(job), remote_python(job), resume_from, world)
    if job.cluster.scheduler == "slurm":   # no node is held between attempts: a job of its own
        where = "a one-node Slurm job (srun)"
        run = lambda: executor.run_step(plan, "universal", script, CONVERT_TIMEOUT_S)  # noqa: E731
    else:
        where = f"node0 {node.host}"
        run = lambda: executor.run(node.login, script, CONVERT_TIMEOUT_S)  # noqa: E731
    code, out = _run_saying(run, printer,
                            f"resume: {where} is still checking {resume_from} or converting it "
                            "to DeepSpeed's universal checkpoint (ds_to_universal rewrites every "
                            "optimizer state)")
    status = next((ln.split(" ", 1)[1] for ln in reversed(out.splitlines())
                   if ln.startswith("mlaunch-universal ")), f"failed exit {code}: {out.strip()[-200:]}")
    if status == "same":
        return False
    word, _, rest = status.partition(" ")
    if word not in ("converted", "done"):
        raise UserError(f"resume from {resume_from} at world {world}: DeepSpeed's universal "
                        f"checkpoint could not be made on {where}: {rest or word}; the run "
                        "ends (the checkpoint itself is untouched)")
    how = "converted" if word == "converted" else "already converted"
    events.emit("universal_checkpoint", path=resume_from, saved_world=int(rest), world=world,
                converted=word == "converted")
    printer.say(f"resume: {resume_from} was saved at world {rest}; {how} to DeepSpeed's universal "
                f"checkpoint on {where} (ds_to_universal), loaded at world {world} "
                "(checkpoint.load_universal)")
    return True


def _run_saying(run, printer: Printer, what: str) -> tuple[int, str]:
    """run() (an executor call: (exit, output)), saying `what` with the time so far every
    TICK_S while it runs (a quick check, e.g. a checkpoint saved at this world, says nothing)."""
    import threading
    import time
    done, result = threading.Event(), []
    worker = threading.Thread(target=lambda: (result.append(run()), done.set()), daemon=True)
    start = time.monotonic()
    worker.start()
    while not done.wait(TICK_S):
        printer.say(f"{what}: {time.monotonic() - start:.0f} s so far")
    return result[0]

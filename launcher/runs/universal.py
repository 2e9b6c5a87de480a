"""Resuming a ZeRO checkpoint at another data-parallel size (issue 29: ZeRO shrink; issue 50:
a resume at another world).

A ZeRO-1/2 checkpoint holds one optimizer shard per rank of the world that saved it. Before
an attempt at another world (a shrink, or a `--resume` on other hosts or GPUs than saved it),
node 0 (under a scheduler: a one-node job) converts it once to DeepSpeed's universal
checkpoint (ds_to_universal, beside the original in the checkpoint directory, marked complete
only after its files are checked: templates/universal.sh.j2), and the attempt's ds_config gets
checkpoint.load_universal, through which the HF Trainer's engine.load_checkpoint reads it.
The forms spec/spare_rules.py leaves unverified for a shrink are refused for such a resume too.
"""
from __future__ import annotations


from .. import render
from ..errors import UserError
from ..logs.stream import Printer
from ..plan.launch_plan import LaunchPlan, remote_bin, remote_python
from ..record.events import EventLog
from ..spec import JobBase, world_size

CONVERT_TIMEOUT_S = 3600.0   # a 70B model's fp32 states are hundreds of GB to rewrite
TICK_S = 30.0                # a line this often while it runs: the console is not silent for minutes


def needed(job: JobBase, resume_from: str | None) -> bool:
    """Whether this resume may load a ZeRO checkpoint at another world: any DeepSpeed resume,
    before the first attempt (the hosts and GPUs may differ from the saving run's) as before
    a restart (a shrink; or the first attempt's own checkpoint saved at another world)."""
    return bool(resume_from and getattr(job, "deepspeed", None))


def _in_image(job: JobBase, plan: LaunchPlan) -> str | None:
    """The runtime line the conversion runs in under cluster.container (podman, docker,
    apptainer: the node script's runtimes), named apart from the nodes' containers."""
    box = job.cluster.container
    if box is None or box.runtime == "pyxis":
        return None
    from ..plan import container as containers
    node = plan.nodes[0]
    return containers.runtime_line(job, name=f"mlaunch-{plan.run_id}-universal", run_dir=plan.run_dir,
                                   env_names=[k for k, _ in node.env], devices=None)


def prepare(job: JobBase, plan: LaunchPlan, executor, resume_from: str | None,
            printer: Printer, events: EventLog) -> bool:
    """Whether the next attempt loads the universal checkpoint: converts resume_from on node 0
    when it was saved at another world; UserError (the run ends) when that fails or the
    DeepSpeed form was never verified at another world. Saved at this world, it costs one
    short command on node 0 (under a scheduler, on the login node)."""
    if not needed(job, resume_from) or _settled(job, plan, executor, resume_from):
        return False
    node, world = plan.nodes[0], world_size(job)
    box = _in_image(job, plan)
    script = render.universal_script(node.env, remote_bin(job), remote_python(job), resume_from, world,
                                     **({"container": box} if box else {}))
    if plan.unheld:   # no node is held between attempts: a job of its own
        where = plan.placement.one_node_job
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


def _settled(job: JobBase, plan: LaunchPlan, executor, resume_from: str) -> bool:
    """True when a quick look says there is nothing to convert (saved at this world), asked
    only where the conversion script would cost more (under a scheduler it is a job of its own) or
    must not run (a form not verified at another world: UserError when the worlds differ)."""
    why, world = _unverified(job), world_size(job)
    if not (why or plan.unheld):
        return False
    saved = saved_world(executor, plan, resume_from)
    if saved == world or (why and saved is None):   # an unverified form is never converted
        return True
    if why:
        raise UserError(f"--resume {resume_from}: saved at world {saved}, this run's world is "
                        f"{world}: {why}; resume at world {saved} (the hosts and gpus_per_node "
                        "that saved it)")
    return False


def _unverified(job: JobBase) -> str | None:
    """Why this job's ZeRO checkpoint may not be resumed at another world (the shrink rule's
    reason, spec/spare_rules.py: e.g. NVMe offload), or None."""
    from ..spec.spare_rules import _zero_form
    what = _zero_form(job)
    return (f"mlaunch converts a ZeRO checkpoint to another world (ds_to_universal) only in the "
            f"forms verified for a shrink (deepspeed.stage 1, 2 or 3 with offload to cpu or "
            f"none), not {what}") if what else None


def saved_world(executor, plan: LaunchPlan, checkpoint: str) -> int | None:
    """The world that saved checkpoint's ZeRO shards, looked up where output_dir lives (node 0;
    under a scheduler the login node) in one short command; None when it is not plain (no DeepSpeed
    tag, shards missing): the conversion script then says what is wrong."""
    code, out = executor.run(plan.nodes[0].login, render.universal_probe(checkpoint), 60)
    words = next((ln.split()[1:] for ln in reversed(out.splitlines())
                  if ln.startswith("mlaunch-saved ")), [])
    if code != 0 or len(words) != 2 or words[0] != words[1] or not words[0].isdigit():
        return None
    return int(words[0]) or None


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

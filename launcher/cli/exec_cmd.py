"""`mlaunch exec JOB [KEY=VALUE]... -- CMD...`: one command on every node of JOB at once
(pdsh's daily use: nvidia-smi, df -h, pip show), registered into the CLI by launcher/cli/main.py."""
from __future__ import annotations

import sys

import click

from ..errors import UserError


class _ExecCommand(click.Command):
    """Everything after `--` is CMD, kept away from click (its options are the node's)."""

    def parse_args(self, ctx, args):
        if "--" in args:
            i = args.index("--")
            ctx.meta["mlaunch_cmd"] = args[i + 1:]
            args = args[:i]
        return super().parse_args(ctx, args)


@click.command("exec", cls=_ExecCommand)
@click.argument("job")
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]... -- CMD...")
@click.pass_context
def exec_cmd(ctx, job: str, overrides: tuple[str, ...]) -> None:
    """Run CMD on every node of JOB at once; exit 0 only if it succeeded on every node.

    Output is prefixed per node, then one exit row per node. One CMD argument is a shell
    command line (`-- 'df -h /data'`), several are run as they are (`-- pip show torch`).
    Under Slurm CMD runs through srun in an allocation of the spec's nodes."""
    from ..backends import backend_of
    from ..logs.stream import Printer
    from .validate import check_path, say_overrides
    from ..spec import load_spec
    from ..spec.overrides import parse
    argv = ctx.meta.get("mlaunch_cmd") or []
    if not any(a.strip() for a in argv):
        from ..spec.overrides import is_override
        words = [o for o in overrides if not is_override(o)]
        if words:   # `mlaunch exec job.yaml hostname`: the command before --, taken for overrides
            raise UserError(f"exec: {words[0]!r} is not KEY=VALUE; put the command after --, e.g. "
                            f"mlaunch exec job.yaml -- {' '.join(words)}")
        raise UserError("exec: no CMD; put the command after --, e.g. mlaunch exec job.yaml -- nvidia-smi")
    check_path(job)
    spec = load_spec(job, parse(overrides))
    say_overrides(spec, err=True)
    backend = backend_of(spec)
    plan = backend.plan(spec)
    printer = Printer(plan.mask)
    sys.exit(_run(backend, plan, argv, printer))


def _run(backend, plan, argv: list[str], printer) -> int:
    """Connect (or allocate), run everywhere, print the exit table; 0 if every node exited 0."""
    from ..session.fanout import exec_nodes, exit_table, run_everywhere
    plan, executor, problems = backend.control(plan, "exec")
    if problems:
        executor.close()
        raise UserError(problems, header="exec: cannot reach every host; the command ran nowhere:")
    try:
        nodes = exec_nodes(plan, argv, guard=backend.guard_exec)
        exits = run_everywhere(nodes, executor, printer)
    finally:
        executor.close()
    for row in exit_table(nodes, exits):
        printer.say(row)
    bad = sum(1 for e in exits if e.code or e.lost)
    printer.say(f"exec: {len(nodes) - bad} of {len(nodes)} node{'' if len(nodes) == 1 else 's'} "
                f"succeeded" + (f"; {bad} failed" if bad else ""))
    return 1 if bad else 0

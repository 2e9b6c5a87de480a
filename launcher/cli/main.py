"""The `mlaunch` command line. Heavy imports (fabric, torch) stay off this module's import path."""
from __future__ import annotations

import functools
import os
import sys
import traceback

import click

from ..errors import UserError
from .validate import check_path


def _load(path: str, overrides: tuple[str, ...] = ()):
    """The spec at path (\"-\": stdin) with the command line's KEY=VALUE overrides applied."""
    from ..spec import load_spec
    from ..spec.overrides import parse
    return load_spec(path, parse(overrides))


class JobPath(click.ParamType):
    """A job spec file argument; a directory is refused in mlaunch's voice instead of click's
    usage block (a missing file: load_spec's own one line)."""

    name = "JOB"

    def convert(self, value, param, ctx):
        check_path(value)
        return value


JOB = JobPath()
OVERRIDES = dict(nargs=-1, metavar="[KEY=VALUE]...")


# Other tools' words for mlaunch's commands (Slurm, torchx, SkyPilot, ...): each runs ours.
ALIASES = {"launch": "submit", "run": "submit", "status": "ps", "queue": "ps", "cancel": "stop"}
# Flags renamed for clarity: the old name still works and says the new one.
OLD_FLAGS = {("submit", "--force"): "--force-unfit", ("resume", "--force"): "--force-unfit",
             ("plan", "--force"): "--force-unfit", ("stop", "--force"): "--kill",
             ("report", "--output-dir"): "--runs-under"}


# Other launchers' flags (torchrun, the DeepSpeed launcher) given to mlaunch: the spec key
# (or override) that says the same, named under click's "No such option" line.
FOREIGN_FLAGS = {
    "--deepspeed": "the override deepspeed.config=FILE, or deepspeed: {config: FILE} in the spec",
    "--hostfile": "the override cluster.hostfile=FILE, or cluster.hostfile in the spec",
    "--nnodes": "the node list cluster.hosts (the override cluster.hosts='[a, b]')",
    "--nproc_per_node": "cluster.gpus_per_node (the override cluster.gpus_per_node=N)",
    "--nproc-per-node": "cluster.gpus_per_node (the override cluster.gpus_per_node=N)",
    "--master_addr": "cluster.master_addr (the override cluster.master_addr=HOST)",
    "--master-addr": "cluster.master_addr (the override cluster.master_addr=HOST)",
    "--master_port": "cluster.master_port (the override cluster.master_port=PORT)",
    "--master-port": "cluster.master_port (the override cluster.master_port=PORT)",
}


class _Group(click.Group):
    """The command list shows each command's whole first sentence, wrapped, never cut off;
    other tools' words for a command (ALIASES) run it."""

    def get_command(self, ctx, cmd_name):
        return super().get_command(ctx, ALIASES.get(cmd_name, cmd_name))

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        return (cmd.name if cmd is not None else name), cmd, rest

    def format_commands(self, ctx, formatter):
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                first = (cmd.short_help or (cmd.help or "").split("\n\n")[0])
                rows.append((name, " ".join(first.split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
            with formatter.section("Aliases"):
                formatter.write_text(", ".join(f"{a} = {c}" for a, c in ALIASES.items()))


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mlaunch")
def cli() -> None:
    """mlaunch: multi-node, multi-GPU fine-tuning in one command."""


def _submit_options(f, start_flags: bool = True):
    """submit's options; start_flags False (`resume`): without --resume and --overwrite."""
    starts = [_resume_option(),
              click.option("--overwrite", is_flag=True, help="Start fresh although output_dir holds checkpoints.")]
    for opt in reversed([
        click.option("--dry-run", is_flag=True, help="Print the per-node commands and files; connect nowhere."),
        click.option("--full", is_flag=True, help="With --dry-run: every node's exact script."),
        click.option("--json", "as_json", is_flag=True, help="With --dry-run: the plan as JSON on stdout."),
        click.option("--run-id", help="Use this run id instead of a fresh one."),
        click.option("--log-dir", help="Where logs/<run-id>/ goes on this machine (default: output_dir)."),
        *(starts if start_flags else []),
        click.option("--max-restarts", type=click.IntRange(0, 100),
                     help="After a node failure, relaunch from the latest checkpoint up to N times."),
        click.option("--no-preflight", is_flag=True, help="Skip the fast preflight checks."),
        click.option("--force-unfit", "--force", "force", is_flag=True,
                     help="Launch although the memory estimate says the batch will not fit the GPUs "
                          "(forces nothing else: preflight and output_dir checks still refuse)."),
        click.option("-d", "--detach", is_flag=True,
                     help="Once every node has started, hand the run to a supervisor and return."),
    ]):
        f = opt(f)
    return f


def _resume_option():
    return click.option("--resume", is_flag=False, flag_value="latest", default=None, metavar="[auto|PATH]",
                        help="Resume from the latest complete checkpoint; --resume=auto starts fresh "
                             "if none; --resume=PATH from that checkpoint (checked for completeness).")


def _run_submit(job: str, dry_run: bool, full: bool, run_id, log_dir, resume, overwrite, max_restarts,
                no_preflight, force=False, detach=False, as_json=False, overrides=()) -> None:
    from ..runs.attempts import SubmitOptions, check_offline
    from ..backends import launch
    for flag, given in (("--full", full), ("--json", as_json)):
        if given and not dry_run:
            raise UserError(f"{flag} only goes with --dry-run")
    spec = _load(job, overrides)
    if max_restarts is not None:   # the recorded plan (ps, report, stop's sweep) holds the policy run
        from .dryrun import _with
        spec = _with(spec, max_restarts=max_restarts)
    opts = SubmitOptions(run_id=run_id, log_dir=log_dir, resume=resume, overwrite=overwrite,
                         max_restarts=max_restarts, preflight=not no_preflight, force=force,
                         overridden=spec._overridden)
    if not dry_run:
        for note in spec._notes:   # every submit says what its overrides changed, as --dry-run does
            if note.startswith("override "):
                click.echo(f"note: {note}")
        sys.exit(launch(spec, opts, detach=detach))
    from .dryrun import dry_run as show
    decision = check_offline(spec, opts)   # a dry run refuses what submit would refuse
    if run_id:
        from ..record.recorder import taken
        from ..record.registry import holder
        if (other := holder(run_id)) is not None:
            raise UserError(taken(run_id, other))
    show(spec, opts, decision, full=full, as_json=as_json)


@cli.command()
@click.argument("job", type=JOB, required=False, metavar="JOB")
@click.argument("overrides", **OVERRIDES)
@_submit_options
def submit(job: str | None, overrides: tuple[str, ...], **kw) -> None:
    """Run JOB on every node (or print the plan with --dry-run).

    KEY=VALUE after JOB overrides the spec before validation (dotted keys, YAML values):
    training.learning_rate=1e-5 cluster.hosts=[a,b]. The dry run shows each override; the
    registry stores the spec with them."""
    from ..spec.overrides import is_override
    if job is not None and is_override(job) and not os.path.exists(job):  # `--resume job.yaml k=v`
        job, overrides = None, (job, *overrides)
    resume = kw["resume"]
    if resume and is_override(resume) and not os.path.exists(resume):   # `--resume k=v`: a flag, then an override
        kw["resume"], overrides = "latest", (resume, *overrides)
    job, kw["resume"] = _job_after_resume(job, kw["resume"])
    _run_submit(job, overrides=overrides, **kw)


SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def _job_after_resume(job: str | None, resume: str | None) -> tuple[str, str | None]:
    """`submit --resume job.yaml`: --resume took the spec as its checkpoint PATH and left no
    JOB. A spec file there and no JOB is unambiguous: JOB it is, resuming from the latest."""
    is_spec = bool(resume) and resume.endswith(SPEC_SUFFIXES) and os.path.isfile(resume)
    if job is None and is_spec:
        return resume, "latest"
    if job is None and resume not in (None, "latest", "auto"):
        raise UserError(f"JOB missing: --resume took {resume!r} as its checkpoint; put JOB first "
                        "(mlaunch submit JOB --resume), or write --resume=PATH")
    if job is None:
        raise click.MissingParameter(param_type="argument", param_hint="'JOB'")
    if is_spec:
        raise UserError(f"--resume {resume}: a job spec file, not a checkpoint directory; give "
                        "--resume alone (the latest checkpoint), --resume=auto, or --resume=PATH")
    return job, resume


@cli.command()
@click.argument("job", type=JOB)
@click.argument("overrides", **OVERRIDES)
@functools.partial(_submit_options, start_flags=False)
def resume(job: str, overrides: tuple[str, ...], **kw) -> None:
    """Same as `submit --resume`: continue JOB from its latest complete checkpoint (another
    checkpoint, or a fresh start if none: `submit --resume=PATH`, `submit --resume=auto`)."""
    _run_submit(job, resume="latest", overwrite=False, overrides=overrides, **kw)


@cli.command()
@click.argument("job", type=JOB)
@click.argument("overrides", **OVERRIDES)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable results on stdout.")
@click.option("--run-id", help="Use this run id instead of a fresh one.")
def check(job: str, overrides: tuple[str, ...], as_json: bool, run_id: str | None) -> None:
    """Run the preflight checklist on every node: one table; exit 0 if all pass, 1 if any fails.

    KEY=VALUE after JOB overrides the spec, as for validate and submit."""
    from .check_cmd import check_command
    sys.exit(check_command(job, as_json=as_json, run_id=run_id, overrides=overrides))


@cli.command()
@click.argument("args", nargs=-1, required=True, metavar="JOB... [KEY=VALUE]...")
@click.option("--json", "as_json", is_flag=True, help="A JSON list on stdout, one object per JOB.")
def validate(args: tuple[str, ...], as_json: bool) -> None:
    """Validate each JOB ("-": standard input); exit 0 if all are ok, else 2.

    Checks what submit checks before it connects (the batch against cluster.gpu_memory_gb
    included), one line per problem. KEY=VALUE arguments override every JOB."""
    from .validate import validate_all
    sys.exit(validate_all(args, as_json))


@cli.command("render")
@click.argument("job", type=JOB)
@click.argument("overrides", **OVERRIDES)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Directory to write to.")
@click.option("--run-id", help="Use this run id instead of a fresh one.")
@_resume_option()
@click.option("--overwrite", is_flag=True, help="Render as submit --overwrite would.")
def render_cmd(job: str, overrides: tuple[str, ...], out: str, run_id: str | None, resume: str | None,
               overwrite: bool) -> None:
    """Write the rendered files and one node<k>.sh per node (Slurm: job.sbatch, node.sh) into OUT
    (as submit would run them)."""
    from ..backends import backend_of
    from ..runs.attempts import SubmitOptions, check_offline
    from .writeout import render_start, write_rendered
    spec = _load(job, overrides)
    from .validate import say_overrides
    say_overrides(spec, err=True)   # stdout lists the files written
    decision = check_offline(spec, SubmitOptions(resume=resume, overwrite=overwrite))
    resume_from, overwrite = render_start(spec, resume, overwrite)
    plan = backend_of(spec).plan(spec, run_id=run_id, resume_from=resume_from, overwrite=overwrite,
                                 memory=decision.inputs if decision else None)   # the dry run's batch
    for path in write_rendered(plan, out):
        click.echo(path)


@cli.command()
def schema() -> None:
    """Print the job spec's JSON Schema (for editor completion)."""
    import json

    from pydantic import TypeAdapter

    from ..spec import Job
    click.echo(json.dumps(TypeAdapter(Job).json_schema(by_alias=True), indent=2))


def _register() -> None:
    """Commands that live in their own modules."""
    from .report import report
    from .runs import register
    from .plan import plan_cmd
    cli.add_command(report)
    cli.add_command(plan_cmd)
    register(cli)  # ps, logs, stop, attach
    from .exec_cmd import exec_cmd
    cli.add_command(exec_cmd)
    from .init_cmd import init_cmd
    cli.add_command(init_cmd)


_register()


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one line per problem and exit 2, no traceback."""
    try:
        _old_flag_notes(sys.argv[1:] if argv is None else argv)
        cli.main(args=argv, prog_name="mlaunch", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        # Outside a running job (connecting, backing off before a restart): nothing to tear down.
        click.echo("mlaunch: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        if isinstance(e, click.NoSuchOption) and e.option_name in FOREIGN_FLAGS:
            click.echo(f"mlaunch: {e.option_name} is another launcher's flag: mlaunch takes "
                       f"{FOREIGN_FLAGS[e.option_name]}", err=True)
        sys.exit(e.exit_code)
    except UserError as e:
        if os.environ.get("MLAUNCH_DEBUG"):
            traceback.print_exc()
        for line in e.lines():
            click.echo(f"mlaunch: {line}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)


def _old_flag_notes(args: list[str]) -> None:
    """A note on stderr for each renamed flag given by its old name (it still works)."""
    if not args:
        return
    cmd = ALIASES.get(args[0], args[0])
    for arg in args[1:]:
        flag = arg.split("=", 1)[0]
        new = OLD_FLAGS.get((cmd, flag))
        if new:
            click.echo(f"mlaunch: note: {cmd} {flag} is the old name of {new}; it still works", err=True)


if __name__ == "__main__":
    main()

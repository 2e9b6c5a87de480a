"""`mlaunch report RUN [RUN_B] [--out DIR]`: registered into the CLI group by launcher/cli/main.py."""
from __future__ import annotations

import math
import os

import click

from ..errors import UserError


class _Window(click.FloatRange):
    """--window: seconds, 1 or more and finite (FloatRange lets nan and inf through)."""

    def convert(self, value, param, ctx):
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds; give e.g. 10", param, ctx)
        return seconds


_WINDOW = _Window(min=1)


@click.command("report")
@click.argument("run")
@click.argument("run_b", required=False)
@click.option("--report-dir", "--out", "out", type=click.Path(file_okay=False), metavar="DIR",
              help="Where to write report.md, report.png, series.json (default: <RUN's log dir>/report; "
                   "with RUN_B: <RUN's log dir>/report-vs-<RUN_B>).")
@click.option("--runs-under", "--output-dir", "output_dir", metavar="OUTPUT_DIR",
              help="Look a RUN given as a run id up under OUTPUT_DIR/logs/ (a job's output_dir) "
                   "instead of the registry; the report still goes to --report-dir.")
@click.option("--window", "window_s", type=_WINDOW, default=10.0, show_default=True,
              help="Seconds per samples/s window (the step records carry whole seconds).")
def report(run: str, run_b: str | None, out: str | None, output_dir: str | None, window_s: float) -> None:
    """Plot and summarise RUN; with RUN_B, overlay the two.

    RUN is a log dir, an output_dir (its newest run), or a registered run (id, unique prefix,
    or job name, as `mlaunch ps --all` lists them)."""
    from ..view.report import require_matplotlib, write_report
    from ..record.runlog import read_run
    paths = [_paths(r, output_dir) for r in (run, run_b) if r is not None]   # the runs first: a typo says so
    require_matplotlib()
    read = [read_run(p) for p in paths]
    text, png = write_report(read, out or _default_dir(read), window_s)
    click.echo(text, nl=False)
    click.echo(f"plot: {png}")


def _default_dir(read) -> str:
    """<RUN's log dir>/report; RUN against RUN_B in a folder of its own (it never overwrites
    RUN's own report): <RUN's log dir>/report-vs-<RUN_B's id>."""
    if len(read) == 1:
        return os.path.join(read[0].paths.log_dir, "report")
    return os.path.join(read[0].paths.log_dir, f"report-vs-{read[1].paths.run_id}")


def _paths(ref: str, output_dir: str | None):
    """RUN's files: a log dir or output_dir as given (runlog.resolve_run), else a run of the
    registry (id prefix or job name, as `mlaunch ps` takes it) by the paths it recorded."""
    from ..record.runlog import resolve_run
    if not ref.strip():
        raise UserError("RUN '': empty; give a run id, a unique prefix of one or a job name (see "
                        "`mlaunch ps --all`), a log dir or an output_dir")
    shown = ref if len(ref) <= 60 else ref[:57] + "..."
    if os.path.exists(ref) or output_dir:
        return resolve_run(ref, output_dir)
    from ..record.registry import Registry
    found = Registry().resolve(ref)
    if found is None:
        raise UserError(f"RUN {shown!r}: not a directory here and no registered run with this id "
                        "prefix or job name (see `mlaunch ps --all`); give a log dir, an "
                        "output_dir, or --runs-under OUTPUT_DIR")
    if isinstance(found, list):
        raise UserError(f"RUN {shown!r}: matches several runs ({', '.join(found[:10])}); give more of the id")
    return registered_paths(found)


def registered_paths(run):
    """RunPaths of a registry row: its log dir must exist; its output_dir where it still does."""
    from ..record.registry import locate
    from ..record.runlog import RunPaths, node_logs, output_dir_of
    if not run.log_dir:
        raise UserError(f"run {run.id}: the registry holds no log dir for it")
    try:
        log_dir = locate(run.log_dir, "log dir")
    except LookupError as e:
        raise UserError(f"run {run.id}: {e}") from None
    if not node_logs(log_dir):
        raise UserError(f"run {run.id} ({run.state}): no node logs in {log_dir}; it started no node")
    try:
        out = locate(run.output_dir, "output_dir") if run.output_dir else None
    except LookupError:
        out = None
    return RunPaths(run.id, log_dir, out or output_dir_of(log_dir))

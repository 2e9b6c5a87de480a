"""`mlaunch report RUN [RUN_B] [--out DIR]`: registered into the CLI group by launcher/cli.py."""
from __future__ import annotations

import os

import click

from .errors import UserError


@click.command("report")
@click.argument("runs", nargs=-1, required=True)
@click.option("--out", type=click.Path(file_okay=False),
              help="Directory for report.md, report.png, series.json (default: <run's log dir>/report).")
@click.option("--output-dir", help="Find a RUN given as a run id under this output_dir's logs/.")
@click.option("--window", "window_s", type=click.FloatRange(min=1), default=10.0, show_default=True,
              help="Seconds per samples/s window (the step records carry whole seconds).")
def report(runs: tuple[str, ...], out: str | None, output_dir: str | None, window_s: float) -> None:
    """Plot and summarise RUN (a log dir, an output_dir, or a run id); RUN RUN_B overlays two."""
    from .report import require_matplotlib, write_report
    from .runlog import read_run, resolve_run
    if len(runs) > 2:
        raise UserError(f"report takes one run, or two to compare; got {len(runs)}")
    require_matplotlib()
    read = [read_run(resolve_run(r, output_dir)) for r in runs]
    text, png = write_report(read, out or os.path.join(read[0].paths.log_dir, "report"), window_s)
    click.echo(text, nl=False)
    click.echo(f"plot: {png}")

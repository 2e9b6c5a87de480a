"""`mlaunch report`: a run's figures (steady-state samples/s, restarts, final loss), a Markdown
summary, the plotted series as JSON, and a PNG (loss, learning rate, samples/s per step
window; restarts as vertical lines). Two runs: their losses overlaid."""
from __future__ import annotations

import importlib
import json
import os
import statistics
from dataclasses import dataclass

from ..errors import UserError
from ..record import fsmode
from ..record.runlog import Run, Step
from . import timeline

MIN_WINDOW_S = 10.0   # step records carry whole seconds: a window this long is within 10 %
MISSING = ("mlaunch report draws with matplotlib, which is not installed here: "
           "pip install 'mlaunch[report]'")


@dataclass(frozen=True)
class Figures:
    """What the summary states about one run, computed from its records."""

    windows: list[tuple[float, float]]     # (middle step, samples/s, or steps/s without a batch)
    steady: float | None                   # median window, each launch's first window left out
    steady_of: int                         # how many windows that median is of
    final_step: int | None
    final_loss: float | None
    unit: str                              # "samples/s" or "steps/s"
    window_s: float = MIN_WINDOW_S


def require_matplotlib() -> None:
    """A one-line user error when the optional extra is missing."""
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise UserError(MISSING) from None


def figures(run: Run, window_s: float = MIN_WINDOW_S) -> Figures:
    """Throughput windows and the run's last loss."""
    wins, firsts = windows(run.steps, run.global_batch, window_s)
    later = [r for i, (_, r) in enumerate(wins) if i not in firsts] or [r for _, r in wins]
    steady = statistics.median(later) if later else None
    last = next((s for s in reversed(run.steps) if s.loss is not None), None)
    return Figures(wins, steady, len(later), last.step if last else None, last.loss if last else None,
                   "samples/s" if run.global_batch else "steps/s", window_s)


def windows(steps: list[Step], global_batch: int | None,
            min_s: float = MIN_WINDOW_S) -> tuple[list[tuple[float, float]], set[int]]:
    """Samples/s over windows of consecutive steps of one launch lasting at least min_s;
    also the indexes of each launch's first window (start-up: not steady state)."""
    out: list[tuple[float, float]] = []
    firsts: set[int] = set()
    per = global_batch or 1
    for seg in sorted({s.segment for s in steps if s.segment >= 0}):
        timed = [s for s in steps if s.segment == seg and s.elapsed is not None]
        anchor, first = (timed[0] if timed else None), True
        for s in timed[1:]:
            dt = s.elapsed - anchor.elapsed
            if dt >= min_s and s.step > anchor.step:
                if first:
                    firsts.add(len(out))
                    first = False
                out.append(((anchor.step + s.step) / 2, (s.step - anchor.step) * per / dt))
                anchor = s
    return out, firsts


def markdown(run: Run, fig: Figures, png: str | None, series: str) -> str:
    """The summary a person reads: one table of figures, the restarts, the checkpoints."""
    gpus = f"{run.nodes} × {run.world // run.nodes}" if run.world and run.nodes else \
        f"{run.nodes} node{'s' if run.nodes != 1 else ''} (processes per node not in the logs)"
    none = "n/a: no step records (a script reports its steps by printing {\"step\": N, \"loss\": x} lines)"
    steps = (f"{fig.final_step}" + (f" / {run.total_steps}" if run.total_steps else "")
             if fig.final_step is not None else none)
    first = min((s.step for s in run.steps), default=None)
    if first is not None and first > 1 and fig.final_step is not None:
        steps += f" (this run's steps {first}–{fig.final_step})"
    rows = [("job", run.job), ("run", run.paths.run_id),
            ("nodes × GPUs", gpus + (f" (world {run.world})" if run.world else "")),
            ("global batch", str(run.global_batch) if run.global_batch else "n/a (not in the logs)"),
            ("steps", steps), ("wall time", _duration(run.wall_s)),
            (f"{fig.unit} (steady state)", _steady(run, fig)),
            ("restarts", str(len(run.restarts))),
            ("checkpoints", str(len(run.checkpoints))),
            ("final loss", f"{fig.final_loss:.4f} (step {fig.final_step})" if fig.final_loss is not None
             else "n/a: no loss in the step records")]
    if run.resumed_from:
        rows.insert(5, ("resumed from", run.resumed_from))
    if run.shared_with:
        rows.append(("output_dir", f"shared with {run.shared_with} other run(s): only this run's own "
                                   "steps are shown"))
    lines = [f"# mlaunch report: {run.paths.run_id}", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    if run.restarts:
        lines += ["", "## Restarts", "", "| attempt | resumed from | at step | why the attempt before ended |",
                  "|---|---|---|---|"]
        lines += [f"| {r.attempt} | {r.checkpoint or 'fresh start'} | {r.step if r.step is not None else '–'} "
                  f"| {r.reason} |" for r in run.restarts]
    if run.checkpoints:
        lines += ["", "## Checkpoints", ""] + [f"- {c}" for c in run.checkpoints]
    health = ["(no events.jsonl in the log dir)"] if run.health is None else \
        [f"- {h}" for h in run.health] or ["none: no hang, NaN or world-size event"]
    lines += ["", "## Health events", ""] + health + timeline.markdown(run.phases)
    lines += ["", "## Files", "", f"- plot: {png}" if png else "- plot: (not drawn)", f"- series: {series}",
              f"- logs: {run.paths.log_dir}"] + [f"- step records: {s}" for s in run.sources]
    return "\n".join(lines) + "\n"


def series(run: Run, fig: Figures) -> dict:
    """Exactly what the PNG plots, for anyone who wants the numbers."""
    return {"run_id": run.paths.run_id,
            "loss": [[s.step, s.loss] for s in run.steps if s.loss is not None],
            "lr": [[s.step, s.lr] for s in run.steps if s.lr is not None],
            "throughput": {"unit": fig.unit, "window_s": fig.window_s, "points": [list(w) for w in fig.windows]},
            "restarts": [{"attempt": r.attempt, "step": r.step, "checkpoint": r.checkpoint,
                          "reason": r.reason} for r in run.restarts],
            "resumed_from": ({"checkpoint": run.resumed_from, "step": _ckpt_step(run.resumed_from)}
                             if run.resumed_from else None),
            "phases": timeline.series(run.phases)}


def plot(data: list[dict], path) -> None:
    """The PNG: loss, learning rate and throughput against step (a panel with nothing to draw
    is left out); restarts and a resume as labelled lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = ["loss"] + (["lr"] if any(d["lr"] for d in data) else []) + \
        (["throughput"] if any(d["throughput"]["points"] for d in data) else [])
    extra = timeline.rows(data)   # the phase timeline's axis below the step axes (view/timeline.py)
    fig, axes = plt.subplots(len(panels) + extra, 1, figsize=(9, 2.7 * len(panels) + 3 * extra + 0.5),
                             squeeze=False)
    steps_axes = axes[:len(panels), 0]
    for ax in steps_axes[:-1]:
        ax.sharex(steps_axes[-1])
        ax.tick_params(labelbottom=False)
    ax_of = dict(zip(panels, steps_axes))
    for i, d in enumerate(data):
        color, name = f"C{i}", d["run_id"] if len(data) > 1 else "loss"
        for key in ("loss", "lr"):
            if key in ax_of:
                pts = d[key]
                ax_of[key].plot([p[0] for p in pts], [p[1] for p in pts], color=color,
                                marker="." if len(pts) < 60 else None, label=name if key == "loss" else None)
        if "throughput" in ax_of:
            xs, ys = _broken(d["throughput"]["points"], [r["step"] for r in d["restarts"] if r["step"] is not None])
            ax_of["throughput"].plot(xs, ys, color=color, marker="o")
        marks = [(r["step"], f"restart {r['attempt']}: " + (os.path.basename(r["checkpoint"]) if r["checkpoint"]
                                                              else "fresh")) for r in d["restarts"]]
        if d.get("resumed_from") and d["resumed_from"]["step"] is not None:
            marks.insert(0, (d["resumed_from"]["step"],
                             f"resumed from {os.path.basename(d['resumed_from']['checkpoint'])}"))
        for step, label in marks:
            if step is None:
                continue
            for ax in ax_of.values():
                ax.axvline(step, color=color, linestyle="--", alpha=0.7)
            ax_of["loss"].annotate(label, (step, 0.97), xycoords=("data", "axes fraction"), rotation=90,
                                   xytext=(-3, 0), textcoords="offset points", va="top", ha="right",
                                   fontsize=8, color=color)
    _readable(ax_of["loss"], [p[1] for d in data for p in d["loss"]])
    ax_of["loss"].set_ylabel("loss")
    if "lr" in ax_of:
        _readable(ax_of["lr"], [p[1] for d in data for p in d["lr"]], from_zero=True)
        ax_of["lr"].ticklabel_format(axis="y", style="sci", scilimits=(-2, 3), useOffset=False)
        ax_of["lr"].set_ylabel("learning rate")
    if "throughput" in ax_of:
        ax_of["throughput"].set_ylabel(data[0]["throughput"]["unit"]
                                       + f"\n(windows ≥ {data[0]['throughput']['window_s']:g} s)")
    steps_axes[-1].set_xlabel("step")
    from matplotlib.ticker import MaxNLocator
    steps_axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))   # steps are whole
    if ax_of["loss"].get_legend_handles_labels()[0]:
        ax_of["loss"].legend(loc="upper right", fontsize=8)
    ax_of["loss"].set_title(" vs ".join(d["run_id"] for d in data), fontsize=10)
    if extra:
        timeline.draw(axes[len(panels), 0], data)
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")   # path: a file name or an open binary file
    plt.close(fig)


# The loss axis spans at least this fraction of the loss's size: a 1 % wiggle stays a wiggle.
MIN_SPAN = 0.2


def _readable(ax, values: list, from_zero: bool = False) -> None:
    """y limits a person can read: a flat or nearly flat series is not zoomed into its noise
    (the span is at least MIN_SPAN of its size); from_zero: the axis starts at 0 (a rate)."""
    vals = [v for v in values if isinstance(v, (int, float)) and v == v and abs(v) != float("inf")]
    if not vals:
        return
    lo, hi = min(vals), max(vals)
    size = max(abs(lo), abs(hi)) or 1.0
    if from_zero and lo >= 0:
        ax.set_ylim(0, hi * 1.15 if hi > 0 else 1.0)
        return
    if hi - lo < MIN_SPAN * size:
        mid = (hi + lo) / 2
        lo, hi = mid - MIN_SPAN * size / 2, mid + MIN_SPAN * size / 2
    pad = (hi - lo) * 0.05
    ax.set_ylim(lo - pad, hi + pad)


def write_report(runs: list[Run], out_dir: str, window_s: float = MIN_WINDOW_S) -> tuple[str, str]:
    """Write report.md, series.json and report.png into out_dir; (markdown text, png path).
    Each 0600 and never through a link or into another user's file (record/fsmode.py): a
    --report-dir in /tmp or a team's folder may hold a planted `report.md -> ~/.bashrc`."""
    require_matplotlib()
    figs = [figures(r, window_s) for r in runs]
    data = [series(r, f) for r, f in zip(runs, figs)]
    png, js, md = (os.path.join(out_dir, n) for n in ("report.png", "series.json", "report.md"))
    text = "\n".join(markdown(r, f, png, js) for r, f in zip(runs, figs))
    try:
        fsmode.check_links(out_dir) if os.path.isdir(out_dir) else fsmode.private_dir(out_dir)
        for path in (png, js, md):   # every name refused before the first is written
            fsmode.check_writable(path)
        fsmode.write_private(js, json.dumps({"runs": data}, indent=1))
        with os.fdopen(fsmode.private_fd(png, os.O_WRONLY | os.O_TRUNC), "wb") as fh:
            plot(data, fh)
        fsmode.write_private(md, text)
    except OSError as e:
        raise UserError(f"--report-dir {out_dir}: cannot write {e.filename or out_dir}: {e.strerror}; "
                        "give a directory you can write") from None
    return text, png


def _broken(points: list, cuts: list[int]) -> tuple[list[float], list[float]]:
    """x and y of points, with a gap (NaN) where a restart lies between two neighbours."""
    xs: list[float] = []
    ys: list[float] = []
    for i, (x, y) in enumerate(points):
        if i and any(points[i - 1][0] < c < x for c in cuts):
            xs.append(float("nan"))
            ys.append(float("nan"))
        xs.append(x)
        ys.append(y)
    return xs, ys


def _steady(run: Run, fig: Figures) -> str:
    if fig.steady is not None:
        n, skip = fig.steady_of, len(fig.windows) - fig.steady_of
        return (f"{fig.steady:.2f} (median of {n} window{'s' if n != 1 else ''} of ≥ {fig.window_s:g} s"
                + ("; each launch's first window left out" if skip else "; start-up windows included")
                + ")")
    own = f"; the trainer's own figure for its last launch: {run.trainer_figure:.2f}" if run.trainer_figure else ""
    return f"n/a: no window of ≥ {fig.window_s:g} s in the step records{own}"


def _ckpt_step(path: str | None) -> int | None:
    from ..record.runshare import checkpoint_step
    return checkpoint_step(path)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a (no events.jsonl and no timestamps in the logs)"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s" if m else f"{seconds:.1f} s"

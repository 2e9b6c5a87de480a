"""A run's phase timeline shown to a person (launcher/record/phases.py reads it): the current
phase for `mlaunch ps RUN`, with a warning for a phase far slower than in the job's previous
run; a bar per phase per attempt for `mlaunch report` (its Markdown and its PNG)."""
from __future__ import annotations

from ..record import phases as ph

BAR_CELLS = 40   # the Markdown bar of the longest attempt
# One colour per kind of phase, so that a restart's phases read apart from a start's at a glance.
COLORS = {"connect": "#9ecae1", "preflight": "#6baed6", "checkpoint": "#c6dbef", "stage": "#4292c6",
          "start": "#2171b5", "rendezvous": "#fd8d3c", "data": "#fdd0a2", "model": "#fdae6b",
          "trainer setup": "#e6550d", "first step": "#a63603", "loading": "#fdae6b",
          "training": "#74c476", "catch-up": "#c7e9c0", "teardown": "#de2d26", "settle": "#fc9272",
          "backoff": "#969696", "decide": "#756bb1", "queued": "#d9d9d9",
          "staging": "#08519c"}


def ps_lines(events: list[dict], now, previous: list[tuple[str, float]] | None = None,
             previous_id: str = "") -> list[str]:
    """The phase going on (`phase: rendezvous 41 s (attempt 0)`), then a warning line per
    phase more than twice as long as in the job's previous run (phases.slow_lines)."""
    timeline = ph.timeline(events, now)
    out = []
    cur = timeline[-1] if timeline and timeline[-1].open else None
    if cur is not None:
        out.append(f"phase: {cur.name} {cur.seconds:.0f} s (attempt {cur.attempt})")
    if previous:
        out += ph.slow_lines([(p.name, p.seconds) for p in timeline], previous, previous_id)
    return out


LONG = frozenset({ph.TRAINING, ph.CATCH_UP})   # drawn short: their length is the job's, written on them


def _cap(attempts: list[list[tuple[str, float]]]) -> float:
    """How long a training bar is drawn: a quarter of the longest attempt's other phases (at
    least 5 s), so that a 3-hour run's start-up still reads at a glance."""
    rest = [sum(secs for name, secs in a if name not in LONG) for a in attempts]
    return max(5.0, 0.25 * max(rest, default=0.0))


def _drawn(secs: float, name: str, cap: float) -> float:
    return min(secs, cap) if name in LONG else secs


def markdown(timeline: list[ph.Phase]) -> list[str]:
    """The timeline section of report.md: one row per phase, a text bar to scale (training's
    drawn short and marked », its seconds in the row)."""
    if not timeline:
        return []
    attempts = [[(p.name, p.seconds) for p in ph.of_attempt(timeline, a)] for a in sorted({p.attempt for p in timeline})]
    cap = _cap(attempts)
    scale = BAR_CELLS / max(max(sum(_drawn(x, n, cap) for n, x in a) for a in attempts), 1e-9)
    lines = ["", "## Where the time went", ""]
    first, back = ph.first_step_s(timeline), ph.back_to_training_s(timeline)
    if first is not None:
        lines.append(f"- submit to the first step: {first:.1f} s")
    lines += [f"- attempt {a}: from the failure seen to training again: {s:.1f} s" for a, s in back.items()]
    lines += ["", "| attempt | phase | from (s) | seconds | |", "|---|---|---|---|---|"]
    for p in timeline:
        cells = _drawn(p.seconds, p.name, cap) * scale
        bar = "█" * int(cells) + ("▌" if cells % 1 >= 0.5 else "") + ("»" if p.seconds > cap and p.name in LONG else "")
        lines.append(f"| {p.attempt} | {p.name}{' (going on)' if p.open else ''} | {p.start_s:.1f} "
                     f"| {p.seconds:.1f} | {bar or '·'} |")
    return lines


def rows(data: list[dict]) -> int:
    """1 when any run of the report has a timeline (its axis), else 0."""
    return int(any(d.get("phases") for d in data))


def _layout(data: list[dict]) -> list[tuple[int, str, str, float, float, float]]:
    """(row, label, phase, x, drawn width, seconds) of every bar: a row per attempt (of each run),
    its phases one after the other from the attempt's start, training drawn short (_cap)."""
    rows_ = [(d, a) for d in data for a in sorted({p[0] for p in d.get("phases", [])})]
    cap = _cap([[(p[1], p[3]) for p in d["phases"] if p[0] == a] for d, a in rows_])
    out = []
    for y, (d, a) in enumerate(rows_):
        label = f"attempt {a}" + (f"\n{d['run_id'][-12:]}" if len(data) > 1 else "")
        x = 0.0
        for _, name, _start, secs in (p for p in d["phases"] if p[0] == a):
            w = _drawn(secs, name, cap)
            out.append((y, label, name, x, w, secs))
            x += w
    return out


def draw(ax, data: list[dict]) -> None:
    """One row per attempt (of each run), a bar per phase in the order they came, seconds since
    the attempt began on x, training drawn short with its length written on it; the phases
    named on their bars where they fit, and the two figures a person asks first in the title."""
    bars = _layout(data)
    labels, seen = [], {}
    for y, label, name, x, w, _secs in bars:
        if y == len(labels):
            labels.append(label)
        bar = ax.barh(y, max(w, 0.05), left=x, height=0.6, color=COLORS.get(name, "#bdbdbd"),
                      edgecolor="white", linewidth=0.5, hatch="//" if name in LONG and w < _secs else None)
        seen.setdefault(name, bar)
    _names_on_bars(ax, bars)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the attempt began (training drawn short, hatched: its length is written on it)",
                  fontsize=8)
    ax.legend(list(seen.values()), list(seen), fontsize=7, ncol=min(6, len(seen)), loc="upper center",
              bbox_to_anchor=(0.5, -0.35), frameon=False)
    ax.set_title(_title(data), fontsize=9)


def _names_on_bars(ax, bars) -> None:
    """Each phase's name and length on its bar where a bar has room (a twelfth of the axis),
    its length alone on a narrower one (a fortieth); the legend names the rest. A shortened
    training bar always says its real length."""
    span = max((x + w for _, _, _, x, w, _ in bars), default=1.0) or 1.0
    for y, _, name, x, w, secs in bars:
        if w >= span / 12 or (name in LONG and w < secs):
            ax.text(x + w / 2, y, f"{name}\n{secs:.1f} s", ha="center", va="center", fontsize=7)
        elif w >= span / 40:
            ax.text(x + w / 2, y, f"{secs:.1f}", ha="center", va="center", fontsize=6)


def _title(data: list[dict]) -> str:
    parts = []
    for d in data:
        timeline = [ph.Phase(*p) for p in d.get("phases", [])]
        first, back = ph.first_step_s(timeline), ph.back_to_training_s(timeline)
        bits = ([f"first step {first:.1f} s after submit"] if first is not None else []) + \
            [f"attempt {a} training again {s:.1f} s after the failure" for a, s in back.items()]
        if bits:
            parts.append("; ".join(bits))
    return "where the time went: " + (" | ".join(parts) or "phases")


def series(timeline: list[ph.Phase]) -> list[list]:
    """The timeline as series.json keeps it: [attempt, name, start s, seconds]."""
    return [[p.attempt, p.name, round(p.start_s, 3), round(p.seconds, 3)] for p in timeline]

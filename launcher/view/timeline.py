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
          "backoff": "#969696", "decide": "#756bb1", "queued": "#d9d9d9"}


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


def markdown(timeline: list[ph.Phase]) -> list[str]:
    """The timeline section of report.md: one row per phase, a text bar to scale."""
    if not timeline:
        return []
    scale = BAR_CELLS / max(max(sum(p.seconds for p in ph.of_attempt(timeline, a))
                                for a in {p.attempt for p in timeline}), 1e-9)
    lines = ["", "## Where the time went", ""]
    first, back = ph.first_step_s(timeline), ph.back_to_training_s(timeline)
    if first is not None:
        lines.append(f"- submit to the first step: {first:.1f} s")
    lines += [f"- attempt {a}: from the failure seen to training again: {s:.1f} s" for a, s in back.items()]
    lines += ["", "| attempt | phase | from (s) | seconds | |", "|---|---|---|---|---|"]
    for p in timeline:
        bar = "█" * int(p.seconds * scale) + ("▌" if p.seconds * scale % 1 >= 0.5 else "")
        lines.append(f"| {p.attempt} | {p.name}{' (going on)' if p.open else ''} | {p.start_s:.1f} "
                     f"| {p.seconds:.1f} | {bar or '·'} |")
    return lines


def rows(data: list[dict]) -> int:
    """1 when any run of the report has a timeline (its axis), else 0."""
    return int(any(d.get("phases") for d in data))


def draw(ax, data: list[dict]) -> None:
    """One row per attempt (of each run), a bar per phase from where it began to where it
    ended, seconds since submit on x; the phases named on their bars where they fit, and the
    two figures a person asks first in the title."""
    labels, seen = [], {}
    for d in data:
        attempts = sorted({p[0] for p in d.get("phases", [])})
        for a in attempts:
            y = len(labels)
            labels.append(f"attempt {a}" + (f"\n{d['run_id'][-12:]}" if len(data) > 1 else ""))
            for _, name, start, secs in (p for p in d["phases"] if p[0] == a):
                bar = ax.barh(y, max(secs, 0.05), left=start, height=0.6, color=COLORS.get(name, "#bdbdbd"),
                              edgecolor="white", linewidth=0.5)
                seen.setdefault(name, bar)
    _names_on_bars(ax, data)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since submit")
    ax.legend(list(seen.values()), list(seen), fontsize=7, ncol=min(6, len(seen)), loc="upper center",
              bbox_to_anchor=(0.5, -0.35), frameon=False)
    ax.set_title(_title(data), fontsize=9)


def _names_on_bars(ax, data: list[dict]) -> None:
    """Each phase's name and length on its bar where a bar has room (a twelfth of the axis),
    its length alone on a narrower one (a fortieth); the legend names the rest."""
    ends = [p[2] + p[3] for d in data for p in d.get("phases", [])]
    span = max(ends, default=1.0) or 1.0
    y = 0
    for d in data:
        for a in sorted({p[0] for p in d.get("phases", [])}):
            for _, name, start, secs in (p for p in d["phases"] if p[0] == a):
                if secs >= span / 12:
                    ax.text(start + secs / 2, y, f"{name}\n{secs:.1f} s", ha="center", va="center",
                            fontsize=7)
                elif secs >= span / 40:
                    ax.text(start + secs / 2, y, f"{secs:.1f}", ha="center", va="center", fontsize=6)
            y += 1


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

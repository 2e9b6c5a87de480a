"""What a run left behind, read back: its node logs (every attempt), the trainer's step records
(LLaMA-Factory's trainer_log.jsonl, ms-swift's logging.jsonl, trainer_state.json) and its
checkpoints. Reads files only; `mlaunch report` draws and summarises what this returns."""
from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime

from . import phases as phase_log, runevents, runshare
from ..errors import UserError

RUN_ID = re.compile(r"^(?P<name>.+)-(?P<time>\d{8}-\d{6})-[0-9a-f]{4}$")
NODE_LOG = re.compile(r"^node(?P<rank>\d+)-.*?(?:\.attempt(?P<attempt>\d+))?\.log$")
STAMP = re.compile(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)")
WORLD = re.compile(r"world size: (\d+)")
GLOBAL_BATCH = re.compile(r"Total train batch size \(w\. parallel, distributed & accumulation\) = (\d+)")
LOADED = re.compile(r"Loading model from (\S+?)\.?$")
CONTINUED = re.compile(r"Continuing training from global step (\d+)")
SAVED = re.compile(r"Saving model checkpoint to (\S+)/checkpoint-\d+")
EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
TRACEBACK = re.compile(r"^\s*traceback\s*:\s*(.+)$")
CHECKPOINT = re.compile(r"checkpoint-(\d+)$")


@dataclass(frozen=True)
class RunPaths:
    """Where one run's files are: its id, its log directory, its trainer output_dir (or None)."""

    run_id: str
    log_dir: str
    output_dir: str | None


@dataclass(frozen=True)
class Step:
    """One logged optimizer step; elapsed: seconds since its attempt's trainer started."""

    step: int
    loss: float | None
    lr: float | None
    elapsed: float | None
    segment: int   # which launch wrote it: the records restart at each attempt


@dataclass(frozen=True)
class Restart:
    """Attempt n (n >= 1): the checkpoint it resumed from, its step, and why attempt n-1 ended."""

    attempt: int
    checkpoint: str | None
    step: int | None
    reason: str


@dataclass
class Run:
    """Everything the report shows about one run."""

    paths: RunPaths
    job: str
    nodes: int
    world: int | None
    global_batch: int | None
    total_steps: int | None
    steps: list[Step]
    restarts: list[Restart]
    checkpoints: list[str]
    wall_s: float | None
    trainer_figure: float | None = None   # the trainer's own samples/s of its last attempt
    sources: list[str] = field(default_factory=list)
    health: list[str] | None = None   # the launcher's health events, one line each; None: no events.jsonl
    resumed_from: str | None = None   # the checkpoint its first attempt resumed (submit --resume)
    shared_with: int = 0              # other runs whose step records share its output_dir
    phases: list = field(default_factory=list)   # its phase timeline (record/phases.py's Phase)


def resolve_run(ref: str, output_dir: str | None = None) -> RunPaths:
    """RUN as given: a run's log dir, an output_dir (its newest run), or a run id under
    output_dir. The one place that knows how runs are found."""
    if os.path.isdir(ref) and node_logs(ref):
        log_dir = os.path.abspath(ref)
        return RunPaths(os.path.basename(log_dir), log_dir, output_dir_of(log_dir))
    if os.path.isdir(os.path.join(ref, "logs")):
        runs = sorted(d for d in os.listdir(os.path.join(ref, "logs")) if node_logs(os.path.join(ref, "logs", d)))
        if runs:
            return RunPaths(runs[-1], os.path.abspath(os.path.join(ref, "logs", runs[-1])), os.path.abspath(ref))
    if output_dir and os.path.isdir(os.path.join(output_dir, "logs", ref)):
        return RunPaths(ref, os.path.abspath(os.path.join(output_dir, "logs", ref)), os.path.abspath(output_dir))
    where = f" under {output_dir}/logs" if output_dir else "; give a log dir, an output_dir, or --runs-under OUTPUT_DIR"
    raise UserError(f"run {ref}: no node logs found{where}")


def read_run(paths: RunPaths) -> Run:
    """Read one run's logs, step records and checkpoints."""
    logs = node_logs(paths.log_dir)            # {(attempt, rank): path}
    text = {k: _read(p) for k, p in logs.items()}
    attempts = sorted({a for a, _ in logs})
    out = paths.output_dir
    events = runevents.read(paths.log_dir)
    restarts = [_restart(a, text, runevents.restarts(events).get(a), runevents.first_failure(events, a - 1))
                for a in attempts if a > 0]
    shared = runshare.sharing(out, paths.log_dir) if out else []
    cuts = {r.step for r in restarts} | runshare.resumed_at(shared)
    steps, sources = step_records(out, cuts) if out else ([], [])
    total = _total_steps(out)
    if len(shared) > 1 and steps:   # other runs wrote into this output_dir: keep this run's own
        steps, total = _own_steps(out, steps, shared, paths.run_id)
    if not steps and (printed := _printed_steps(logs, text)):
        # No trainer log (a script job): the {"step": N, "loss": x} lines rank 0 printed.
        steps, sources = printed, [logs[min(k for k in logs if k[1] == 0)]] if any(k[1] == 0 for k in logs) else []
    if not steps and (recorded := runevents.step_events(events)):
        # No trainer log (a script job): the steps and losses the launcher's health watch saw.
        steps = [Step(*r) for r in {r[0]: r for r in recorded}.values()]
        steps.sort(key=lambda st: st.step)
        sources = [os.path.join(paths.log_dir, "events.jsonl")]
    every = "\n".join(text.values())
    return Run(
        paths=paths, job=_job_name(paths.run_id), nodes=len({r for _, r in logs}),
        world=_first_int(WORLD, every), global_batch=_first_int(GLOBAL_BATCH, every),
        total_steps=total, steps=steps,
        restarts=restarts,
        checkpoints=checkpoints(out) if out else [],
        wall_s=runevents.wall_s(events) or _wall(paths, text),
        trainer_figure=_trainer_figure(out), sources=sources,
        health=runevents.health_lines(events) if events else None,
        resumed_from=next((e.get("resume_from") for e in events if e.get("event") == "run_start"), None),
        shared_with=len(shared) - 1 if len(shared) > 1 else 0,
        phases=phase_log.timeline(events))


def _own_steps(output_dir: str, steps: list[Step], shared: list[str], run_id: str) -> tuple[list[Step], int | None]:
    """The steps of run_id's own launches (segment = its attempt), and the planned total its
    last record states (runshare says which launches of the shared file are whose)."""
    order: dict[int, list[Step]] = {}
    for st in steps:
        if st.segment >= 0:
            order.setdefault(st.segment, []).append(st)
    own = runshare.own_segments(list(order.items()), runshare.launches(shared), run_id)
    mine = [Step(st.step, st.loss, st.lr, st.elapsed, own[st.segment]) for st in steps if st.segment in own]
    last = mine[-1].step if mine else None
    totals = [t for step, t in _totals(output_dir) if step == last]
    return mine, (totals[-1] if totals else None)


def _totals(output_dir: str) -> list[tuple[int, int]]:
    """(step, planned total) of every LLaMA-Factory / ms-swift record in output_dir."""
    paths = [os.path.join(output_dir, "trainer_log.jsonl")] + \
        sorted(glob.glob(os.path.join(output_dir, "v*-*", "logging.jsonl")))
    out = []
    for r in (r for p in paths for r in runevents.jsonl(p)):
        if "current_steps" in r and "total_steps" in r:
            out.append((int(r["current_steps"]), int(r["total_steps"])))
        elif "global_step/max_steps" in r:
            a, _, b = str(r["global_step/max_steps"]).partition("/")
            if a.isdigit() and b.isdigit():
                out.append((int(a), int(b)))
    return out


def _printed_steps(logs: dict, text: dict) -> list[Step]:
    """The JSON step lines (`{"step": 3, "loss": 0.25}`, the form the health watch reads from a
    script) of rank 0's log of each attempt; the last of a step wins. Elapsed: their "time"
    key's seconds from the attempt's first line, when they carry one."""
    steps: dict[int, Step] = {}
    for (attempt, rank) in sorted(logs):
        if rank != 0:
            continue
        t0 = None
        for line in text[(attempt, rank)].splitlines():
            d = _dict_line(line)
            step = _step_of(d) if d else None
            if step is None:
                continue
            t = _float(d.get("time"))
            t0 = t if t0 is None else t0
            steps[step] = Step(step, _float(d.get("loss")), _float(d.get("lr", d.get("learning_rate"))),
                               None if t is None else t - t0, attempt)
    return [steps[k] for k in sorted(steps)]


def _dict_line(line: str) -> dict | None:
    """A line that is a JSON object or a Python dict literal (the HF Trainer prints those)."""
    line = line.strip()
    if not (line.startswith("{") and line.endswith("}") and "step" in line):
        return None
    from .. import pyparse
    for parse in (json.loads, pyparse.literal_eval):
        try:
            d = parse(line)
            return d if isinstance(d, dict) else None
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
    return None


def _step_of(d: dict) -> int | None:
    """`step`, or ms-swift's `global_step/max_steps` "3/8"; None for neither."""
    step = d.get("step")
    if isinstance(step, int) and not isinstance(step, bool):
        return step
    head = str(d.get("global_step/max_steps", "")).partition("/")[0]
    return int(head) if head.isdigit() else None


def _float(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def step_records(output_dir: str, resumed_at: set[int] = frozenset()) -> tuple[list[Step], list[str]]:
    """Per-step loss, lr and elapsed time, one per step (the last launch that logged it wins);
    steps only trainer_state.json knows fill the gaps. A new launch starts where the step or
    the elapsed time goes back, or after a step a restart resumed from."""
    raw, sources = [], []
    lf = os.path.join(output_dir, "trainer_log.jsonl")
    swift = sorted(glob.glob(os.path.join(output_dir, "v*-*", "logging.jsonl")))
    for path in ([lf] if os.path.exists(lf) else []) + swift:
        sources.append(path)
        raw += [_record(r) for r in runevents.jsonl(path)]
    steps, seg, last = {}, 0, None
    for rec in (r for r in raw if r and r[1] is not None):   # records with a loss: one per step
        step, loss, lr, elapsed = rec
        if last is not None and (step <= last[0] or last[0] in resumed_at or (
                elapsed is not None and last[1] is not None and elapsed < last[1])):
            seg += 1
        steps[step] = Step(step, loss, lr, elapsed, seg)
        last = (step, elapsed)
    missing = [e for e in _state_history(output_dir) if "loss" in e and e.get("step") not in steps]
    for e in missing:
        steps[e["step"]] = Step(e["step"], e["loss"], e.get("learning_rate"), None, -1)
    if missing:
        sources.append("trainer_state.json")
    return [steps[k] for k in sorted(steps)], sources


def checkpoints(output_dir: str) -> list[str]:
    """Checkpoint directories in output_dir (and ms-swift's v*/), by step."""
    found = glob.glob(os.path.join(output_dir, "checkpoint-*")) + \
        glob.glob(os.path.join(output_dir, "v*-*", "checkpoint-*"))
    found = [p for p in found if os.path.isdir(p) and CHECKPOINT.search(p)]
    return sorted(found, key=lambda p: int(CHECKPOINT.search(p).group(1)))


def _record(r: dict) -> tuple | None:
    """(step, loss, lr, elapsed s) of a LLaMA-Factory or ms-swift record; None if it is neither."""
    if "current_steps" in r:                                   # LLaMA-Factory
        return r["current_steps"], r.get("loss"), r.get("lr"), _hms(r.get("elapsed_time"))
    if "global_step/max_steps" in r:                           # ms-swift
        step = int(str(r["global_step/max_steps"]).split("/")[0])
        return step, r.get("loss"), r.get("learning_rate"), _dhms(r.get("elapsed_time"))
    return None


def _restart(attempt: int, text: dict, event: dict | None, exited: str | None) -> Restart:
    """What attempt `attempt` resumed from and why the one before ended: the launcher's
    restart event when there is one, else the attempt's own log; torchrun's root cause, else
    `exited` (the first failing node's exit from events.jsonl)."""
    mine = "\n".join(t for (a, _), t in sorted(text.items()) if a == attempt)
    ckpt = (event or {}).get("resume_from") or next(
        (m.group(1) for line in mine.splitlines() if (m := LOADED.search(line)) and CHECKPOINT.search(m.group(1))),
        None)
    step = int(CHECKPOINT.search(ckpt).group(1)) if ckpt and CHECKPOINT.search(ckpt) else \
        _first_int(CONTINUED, mine)
    cause = _reason({r: t for (a, r), t in text.items() if a == attempt - 1}) or exited or \
        "no root cause in the logs (connection lost or launcher stopped?)"
    said = (event or {}).get("reason")
    return Restart(attempt, ckpt, step, f"{said}: {cause}" if said and said not in cause else cause)


def _reason(node_text: dict[int, str]) -> str | None:
    """The root cause torchrun reported, on the node where it was not mlaunch's own SIGTERM."""
    causes = []
    for rank, t in sorted(node_text.items()):
        lines = t.splitlines()
        start = next((i for i, ln in enumerate(lines) if "Root Cause (first observed failure)" in ln), None)
        if start is None:
            continue
        block = lines[start:start + 12]
        code = next((int(m.group(1)) for ln in block if (m := EXITCODE.match(ln))), None)
        why = next((m.group(1).strip() for ln in block if (m := TRACEBACK.match(ln))), "")
        if code is not None:
            causes.append((code in (-15, 15), f"node{rank}: exit {128 - code if code < 0 else code}"
                                              + (f" ({why})" if why and "<N/A>" not in why else "")))
    causes.sort(key=lambda c: c[0])
    return causes[0][1] if causes else None


def _wall(paths: RunPaths, text: dict) -> float | None:
    """Without events.jsonl: from the run id's start (or the first stamped log line) to the
    last stamped line."""
    stamps = [datetime.fromisoformat(s.replace(" ", "T")) for t in text.values() for s in STAMP.findall(t)]
    m = RUN_ID.match(paths.run_id)
    start = datetime.strptime(m.group("time"), "%Y%m%d-%H%M%S") if m else (min(stamps) if stamps else None)
    end = max(stamps) if stamps else None
    if start is None or end is None:
        return None
    if abs((min(stamps) - start).total_seconds()) > 3600:   # stamps are local time, the id UTC
        start = min(stamps)
    return max(0.0, (end - start).total_seconds())


def node_logs(log_dir: str) -> dict[tuple[int, int], str]:
    if not os.path.isdir(log_dir):
        return {}
    out = {}
    for name in os.listdir(log_dir):
        if m := NODE_LOG.match(name):
            out[(int(m.group("attempt") or 0), int(m.group("rank")))] = os.path.join(log_dir, name)
    return out


def output_dir_of(log_dir: str) -> str | None:
    """output_dir/logs/<run-id> is the default layout; else where the logs say checkpoints went."""
    parent = os.path.dirname(os.path.dirname(log_dir))
    if os.path.basename(os.path.dirname(log_dir)) == "logs" and (
            glob.glob(os.path.join(parent, "checkpoint-*")) or glob.glob(os.path.join(parent, "*.json*"))):
        return parent
    for path in node_logs(log_dir).values():
        if m := SAVED.search(_read(path)):
            return m.group(1)
    return None


def _state_history(output_dir: str) -> list[dict]:
    """log_history of trainer_state.json, else of the newest checkpoint's (a run still going)."""
    cands = [os.path.join(output_dir, "trainer_state.json")] + \
        [os.path.join(c, "trainer_state.json") for c in reversed(checkpoints(output_dir))]
    for path in cands:
        try:
            with open(path, encoding="utf-8") as fh:
                return json.load(fh).get("log_history", [])
        except (OSError, ValueError):
            continue
    return []


def _total_steps(output_dir: str | None) -> int | None:
    """The planned step count the trainer's last record states."""
    paths = [os.path.join(output_dir, "trainer_log.jsonl")] + \
        sorted(glob.glob(os.path.join(output_dir, "v*-*", "logging.jsonl"))) if output_dir else []
    for r in reversed([r for p in paths for r in runevents.jsonl(p)]):
        if "total_steps" in r or "global_step/max_steps" in r:
            return int(r.get("total_steps") or str(r["global_step/max_steps"]).split("/")[1])
    return None


def _trainer_figure(output_dir: str | None) -> float | None:
    """train_samples_per_second the trainer printed for its last attempt (start-up included)."""
    for r in reversed(_state_history(output_dir) if output_dir else []):
        if "train_samples_per_second" in r:
            return float(r["train_samples_per_second"])
    return None


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:   # a torn UTF-8 tail is no error
        return fh.read()


def _first_int(pattern: re.Pattern, text: str) -> int | None:
    return int(m.group(1)) if (m := pattern.search(text)) else None


def _job_name(run_id: str) -> str:
    m = RUN_ID.match(run_id)
    return m.group("name") if m else run_id


def _hms(text) -> float | None:
    """LLaMA-Factory's "H:MM:SS" (or "1 day, H:MM:SS") in seconds."""
    if not isinstance(text, str) or ":" not in text:
        return None
    days = 0
    if "day" in text:
        d, _, text = text.partition(",")
        days = int(d.split()[0])
    h, m, s = (float(x) for x in text.strip().split(":"))
    return days * 86400 + h * 3600 + m * 60 + s


def _dhms(text) -> float | None:
    """ms-swift's "1d 2h 3m 4s" in seconds."""
    if not isinstance(text, str):
        return None
    unit = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"(\d+(?:\.\d+)?)([dhms])", text)
    return sum(float(n) * unit[u] for n, u in parts) if parts else None

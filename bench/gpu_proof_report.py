"""Tables of bench/gpu_proof.py's results.jsonl files (one or more calls' worth)."""
from __future__ import annotations

import json
import statistics


def load(files: list[str]) -> list[dict]:
    out = []
    for f in files:
        with open(f) as fh:
            out += [json.loads(line) for line in fh if line.strip()]
    return out


def med(values: list) -> float | None:
    v = [x for x in values if x is not None]
    return round(statistics.median(v), 2) if v else None


def ratio(a, b) -> str:
    return f"{a / b:.3f}" if a and b else "n/a"


def summarize(files: list[str]) -> str:
    """The tables of each file on its own (runs of different settings are never mixed)."""
    if len(files) > 1:
        return "\n".join(f"# {f}\n\n" + summarize([f]) for f in files)
    recs = load(files)
    return "\n".join(filter(None, [_check(recs), _pair(recs, "lora", "mlaunch", "by-hand"),
                                   _pair(recs, "nodes2", "2x1", "1x2"), _zero3(recs),
                                   _fault(recs), _memory(recs)]))


def _check(recs: list[dict]) -> str:
    rows = [r for r in recs if r["part"] == "check"]
    if not rows:
        return ""
    lines = ["## mlaunch check: all-reduce bus bandwidth (GB/s)", "",
             "| size | mlaunch check (median, runs) | by hand (median, runs) | ratio |", "|---|---|---|---|"]
    for mb in sorted({r["mb"] for r in rows}):
        ours = [r["busbw_gbps"] for r in rows if r["mb"] == mb and r["kind"] == "mlaunch"]
        hand = [r["busbw_gbps"] for r in rows if r["mb"] == mb and r["kind"] == "by-hand"]
        lines.append(f"| {mb} MB | {med(ours)} {ours} | {med(hand)} {hand} | {ratio(med(ours), med(hand))} |")
    gpu = {s for r in rows for s in r.get("gpu_rows", [])}
    lines.append(f"\ngpu rows seen: {sorted(gpu)}")
    return "\n".join(lines) + "\n"


def _pair(recs: list[dict], part: str, a: str, b: str) -> str:
    rows = [r for r in recs if r["part"] == part]
    if not rows:
        return ""
    lines = [f"## {part}: {a} against {b}", "",
             "| run | rc | samples/s (trainer) | steady samples/s | wall s |", "|---|---|---|---|---|"]
    for kind in (a, b):
        for r in (x for x in rows if x["kind"] == kind):
            lines.append(f"| {kind} {r['i']} | {r['rc']} | {r['samples_per_s']} | "
                         f"{r['steady_samples_per_s']} | {r['wall_s']} |")
    sa, sb = ([r["samples_per_s"] for r in rows if r["kind"] == k] for k in (a, b))
    ta, tb = ([r["steady_samples_per_s"] for r in rows if r["kind"] == k] for k in (a, b))
    lines.append(f"\nmedian samples/s: {a} {med(sa)}, {b} {med(sb)}, ratio {ratio(med(sa), med(sb))}; "
                 f"steady: {a} {med(ta)}, {b} {med(tb)}, ratio {ratio(med(ta), med(tb))}")
    return "\n".join(lines) + "\n"


def _zero3(recs: list[dict]) -> str:
    run = [r for r in recs if r["part"] == "zero3" and r["kind"] == "mlaunch"]
    info = [r for r in recs if r["part"] == "zero3" and r["kind"] == "rendered"]
    if not run:
        return ""
    r, i = run[-1], (info[-1] if info else {})
    return (f"## zero3\n\nrc {r['rc']}, samples/s {r['samples_per_s']}, steady {r['steady_samples_per_s']}, "
            f"wall {r['wall_s']} s, global_step {i.get('global_step')} of {i.get('max_steps')}; "
            f"rendered warmup: {[w.strip() for w in i.get('warmup_lines', [])]}\n")


def _fault(recs: list[dict]) -> str:
    run = [r for r in recs if r["part"] == "fault" and r["kind"] == "mlaunch"]
    after = [r for r in recs if r["part"] == "fault" and r["kind"] == "after"]
    if not run or not after:
        return ""
    r, a = run[-1], after[-1]
    verdict = ("PROVEN: killed, resumed, finished" if a["killed_pid"] and a["resumed"] and r["rc"] == 0
               else "NOT PROVEN: no rank was killed or it did not resume")
    return (f"## fault ({verdict})\n\nrc {r['rc']}, wall {r['wall_s']} s, killed pid {a['killed_pid']}, "
            f"global_step {a['global_step']}, resumed from {a['resumed']}, attempts {a['attempts']}\n"
            f"GPU compute apps after: {a['gpu_apps_after']!r}; memory.used after: {a['gpu_used_after']!r}; "
            f"job processes left: {a['job_pids_left']}\n")


def _memory(recs: list[dict]) -> str:
    rows = [r for r in recs if r.get("peak_mib")]
    if not rows:
        return ""
    lines = ["## peak GPU memory per rank (nvidia-smi memory.used, MiB, max over runs)", "",
             "| run | GPU 0 | GPU 1 |", "|---|---|---|"]
    for key in dict.fromkeys((r["part"], r["kind"]) for r in rows):
        peaks = [r["peak_mib"] for r in rows if (r["part"], r["kind"]) == key]
        g = [max(int(p.get(str(i), p.get(i, 0)) or 0) for p in peaks) for i in (0, 1)]
        lines.append(f"| {key[0]} {key[1]} | {g[0]} | {g[1]} |")
    return "\n".join(lines) + "\n"

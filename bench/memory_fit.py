"""Refit launcher/plan/memory.py's constants to measured peak memory (issue 15).

Reads results files (JSON lines with "model" = config.json fields, "setting" = memory.Setting
fields, "peak_mib" = the nvidia-smi peak, as bench/memory_proof.py writes them; lines without
peak_mib, with rc != 0 or marked "superseded" are skipped), solves the linear least-squares problem of relative
errors for the chosen constants (the others keep their current values), prints every row's
estimate / measured, and with --write rewrites the FIT block of launcher/plan/memory.py.

Usage:
    python3 bench/memory_fit.py bench/results/memory/*.jsonl [--params overhead_mib,act_scale,logit_bytes]
    python3 bench/memory_fit.py FILES... --write
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from launcher.plan import memory  # noqa: E402

DEFAULT = ("overhead_mib", "act_scale", "logit_bytes", "zero3_scale")


def load(paths: list[str]) -> list[dict]:
    """Measured rows (with a peak, from a run that succeeded), in file order."""
    rows = []
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    rec = json.loads(line)
                    # "superseded": measured with a render mlaunch no longer produces (kept, not fitted)
                    if rec.get("peak_mib") and rec.get("rc", 0) == 0 and "setting" in rec \
                            and not rec.get("superseded"):
                        rows.append({**rec, "peak_mib": peak_of(rec)})
    return rows


def peak_of(rec: dict) -> float | None:
    """The nvidia-smi peak in MiB: a number, or gpu_proof's {gpu index: MiB} (the largest)."""
    peak = rec.get("peak_mib")
    return max(peak.values(), default=None) if isinstance(peak, dict) else peak


def row_case(rec: dict) -> tuple[memory.Shape, memory.Setting]:
    st = dict(rec["setting"])
    st["lora_targets"] = tuple(st.get("lora_targets") or ("all",))
    return memory.shape_from_config(rec["model"]), memory.Setting(**st)


def solve(a: list[list[float]], b: list[float]) -> list[float]:
    """x minimising |Ax - b|² (normal equations, Gauss-Jordan with partial pivoting)."""
    n = len(a[0])
    m = [[sum(r[i] * r[j] for r in a) for j in range(n)] + [sum(r[i] * y for r, y in zip(a, b))]
         for i in range(n)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        if abs(m[c][c]) < 1e-300:
            raise SystemExit(f"constant {c} is not determined by these rows; fit fewer --params")
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit(rows: list[dict], params: tuple[str, ...]) -> dict:
    """New FIT values: relative least squares over the rows for `params`."""
    a, b = [], []
    for rec in rows:
        shape, st = row_case(rec)
        f = memory.features(shape, st)
        peak = rec["peak_mib"] * memory.MIB
        fixed = f["const"] + sum(memory.FIT[k] * f[k] for k in f if k != "const" and k not in params)
        a.append([f[k] / peak for k in params])
        b.append((peak - fixed) / peak)
    x = solve(a, b) if a else []
    return {**memory.FIT, **{k: round(v, 4) for k, v in zip(params, x)}}


def report(rows: list[dict], fitted: dict) -> tuple[str, bool]:
    """One line per row (estimate / measured) and whether the issue's goals hold."""
    lines, ok = [], True
    for rec in rows:
        shape, st = row_case(rec)
        est = memory.estimate(shape, st, fitted).total / memory.MIB
        ratio = est / rec["peak_mib"]
        good = 0.95 <= ratio <= 1.15   # the goal: ±15 %, never under by more than 5 %
        ok &= good
        lines.append(f"{rec.get('name', '?'):<14} {st.finetuning:<5} zero {str(st.zero_stage):<4} "
                     f"ckpt {'on ' if st.checkpointing else 'off'} b {st.micro_batch:<3} "
                     f"measured {rec['peak_mib']:>8.0f} MiB  estimate {est:>8.0f}  ratio {ratio:.3f}"
                     f"{'' if good else '  OUTSIDE -5%..+15%'}")
    return "\n".join(lines), ok


def write(fitted: dict, sources: list[str], params: tuple[str, ...]) -> None:
    """Rewrite the FIT block of launcher/plan/memory.py."""
    path = os.path.join(ROOT, "launcher", "memory.py")
    text = open(path, encoding="utf-8").read()
    body = {k: v for k, v in fitted.items() if k not in ("source", "params")}
    lines = [f'    "{k}": {v!r},' for k, v in body.items()]
    lines.append(f'    "params": {",".join(params)!r},')
    lines.append(f'    "source": {", ".join(os.path.relpath(s, ROOT) for s in sources)!r},')
    block = "FIT = {\n" + "\n".join(lines) + "\n}\n"
    new = re.sub(r"(# BEGIN FIT[^\n]*\n)FIT = \{.*?\n\}\n", lambda m: m.group(1) + block, text, flags=re.S)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--params", default=",".join(DEFAULT), help="constants to fit (others kept)")
    ap.add_argument("--write", action="store_true", help="rewrite the FIT block of launcher/plan/memory.py")
    a = ap.parse_args()
    rows = load(a.files)
    params = tuple(p for p in a.params.split(",") if p)
    if any(r["setting"].get("finetuning") == "full" for r in rows) and "state_scale" not in params:
        print("note: full fine-tuning rows present; consider --params ...,state_scale")
    fitted = fit(rows, params)
    print(json.dumps({k: v for k, v in fitted.items() if k not in ("source", "params")}))
    text, ok = report(rows, fitted)
    print(text)
    print(f"{len(rows)} rows; goals (-5% .. +15%) {'met' if ok else 'NOT met'}")
    if a.write:
        write(fitted, a.files, params)
        print("wrote launcher/plan/memory.py FIT")


if __name__ == "__main__":
    main()

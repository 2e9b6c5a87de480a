"""Write bench/README.md from bench/results/: one entry per result, its own words.

The figures in bench/README.md are never typed by hand: each entry is the title and the
lines a result file states as its outcome (``Result:``, ``Made by:``, ratio and median
lines), so rerunning this after a benchmark is the only way the page changes.
Usage: python bench/make_readme.py [--check]   (--check: exit 1 when the page is stale)
"""
from __future__ import annotations

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
KEYS = re.compile(r"^(Result|Made by|Made with|Ratio|ratio|median|Median|Figures?)\b|\bratio\b|\bmedian\b")
MAX_LINES = 8


def main(argv: list[str]) -> int:
    text = page()
    out = os.path.join(HERE, "README.md")
    if "--check" in argv:
        with open(out, encoding="utf-8") as fh:
            return 0 if fh.read() == text else 1
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(text)
    return 0


def page() -> str:
    parts = [HEADER]
    for name in sorted(os.listdir(RESULTS)):
        parts.append(entry(name, os.path.join(RESULTS, name)))
    return "\n".join(parts)


def entry(name: str, path: str) -> str:
    """One result: its title line and up to MAX_LINES of its outcome lines."""
    main_file = os.path.join(path, "README.md") if os.path.isdir(path) else path
    link = f"results/{name}" + ("/" if os.path.isdir(path) else "")
    if not os.path.isfile(main_file) or not main_file.endswith((".txt", ".md")):
        return f"### [{name}]({link})\n\n(data files; no summary)\n"
    with open(main_file, encoding="utf-8", errors="replace") as fh:
        lines = [ln.rstrip() for ln in fh]
    title = next((ln.lstrip("# ") for ln in lines if ln.strip()), name)
    said = [ln.strip() for ln in lines[1:] if KEYS.search(ln.strip())][:MAX_LINES]
    body = "\n".join(f"- {ln[:300]}" for ln in said) or "(see the file)"
    return f"### [{name}]({link})\n\n{title[:300]}\n\n{body}\n"


HEADER = """# Benchmarks: what was measured

Made by `python bench/make_readme.py` from `bench/results/`; do not edit by hand. Each
entry is a result as its file states it; the scripts that made them are in this folder, and
[docs/testing.md](../docs/testing.md) lists how to run them. Figures are from the
2-core development machine unless the entry names the GPU machine.
"""

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

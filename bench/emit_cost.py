"""What each step of reading a node's output in the launcher costs per byte (the Slurm follow,
backends/slurm/follow.py, reads its nodes' files this way), on the flood's 100-byte lines in
~900 KiB chunks, and what some single scans cost beside them.

  python3 bench/emit_cost.py            # ns per byte, each step
"""
from __future__ import annotations

import io
import os
import tempfile
import time

from launcher.logs.stream import LineSplitter, NodeLog, Printer
from launcher.logs.torchrun_out import TorchrunRootCause
from launcher.watch.watch import Watch
from launcher.plan.launch_plan import build_plan
from launcher.spec import validate
from launcher.view import nodeview
from tests.helpers import script_job

LINE = "%09d " + "x" * 89 + "\n"
PER_CHUNK = 9400   # 100-byte lines: 940 kB


def steps(chunks: list[bytes]) -> dict[str, float]:
    """Seconds spent in each step over the chunks, as one node's reader runs them."""
    tmp = tempfile.mkdtemp()
    plan = build_plan(validate(script_job(["10.0.0.1", "10.0.0.2"], 1, "allreduce.py", [],
                                          os.path.join(tmp, "out"))))
    split, cause = LineSplitter(), TorchrunRootCause()
    log = NodeLog(os.path.join(tmp, "node0.log"))
    printer = Printer(plan.mask, io.StringIO())
    watch = Watch(plan, None, printer.say, time.monotonic)
    spent: dict[str, float] = {}

    def timed(name, f, *a):
        t = time.perf_counter()
        r = f(*a)
        spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        return r
    for chunk in chunks:
        text = timed("split", split.feed_text, chunk)
        text, _ = timed("samples", nodeview.split_text, text)
        timed("root cause", cause.see_text, text)
        masked = timed("mask", plan.mask, text)
        timed("node log", log.write, masked)
        timed("health", watch.text, 0, "10.0.0.1", text)
    return spent


def scans(text: str, rounds: int = 20) -> dict[str, float]:
    """ns per byte of single passes over one chunk's text."""
    raw = text.encode()
    where = tempfile.mkdtemp()
    fd = os.open(os.path.join(where, "w"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    # The node log as it was before 2543eab: a line-buffered text file, written a text at a time.
    lined = open(os.path.join(where, "t"), "a", encoding="utf-8", buffering=1)
    ops = {"'Root Cause' in str": lambda: "Root Cause" in text, "'R' in str": lambda: "R" in text,
           "str.count('\\n')": lambda: text.count("\n"), "bytes.count(b'\\n')": lambda: raw.count(b"\n"),
           "str.encode()": text.encode, "os.write(bytes)": lambda: os.write(fd, raw),
           "line-buffered text .write(str)": lambda: lined.write(text)}
    out = {}
    for name, op in ops.items():
        t = time.perf_counter()
        for _ in range(rounds):
            op()
        out[name] = (time.perf_counter() - t) / rounds / len(raw) * 1e9
    return out


def main() -> None:
    chunks = [("".join(LINE % (i * PER_CHUNK + k) for k in range(PER_CHUNK))).encode() for i in range(40)]
    mb = sum(map(len, chunks)) / 1e6
    for _ in range(2):   # the second round is the one to read (files and caches warm)
        spent = steps(chunks)
    total = sum(spent.values())
    print(f"_emit: {total / mb * 1e3:.3f} ms per MB ({mb:.0f} MB in {len(chunks)} chunks)")
    for name, s in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {name:11s} {s / mb * 1e3:.3f} ms/MB  {s / total:4.0%}")
    print("single passes over a chunk, ns per byte:")
    for name, ns in scans(chunks[0].decode()).items():
        print(f"  {name:30s} {ns:.3f}")


if __name__ == "__main__":
    main()

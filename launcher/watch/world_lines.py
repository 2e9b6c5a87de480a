"""The world-size lines of the ranks' output: which lines state the world a job's ranks joined.

Used by health.Monitor's world-size check (see launcher/health.py's module doc).
"""
from __future__ import annotations

import re

# The lines that state the world this job's ranks joined, each in its writer's own words
# (tests/data/ holds recorded output of each). Anchored: torchrun at INFO also prints
# group_world_size (the node count), local_world_size and role_world_sizes, and a bare
# "world_size=" pattern read the node count as the world (issue 31).
TEE_PREFIX = re.compile(r"^\[[A-Za-z_]*\d+\]:")   # torchrun --tee's "[default0]:"
WORLD_LINES = (
    # LLaMA-Factory: "... parser:523 >> Process rank: 0, world size: 2, device: cpu:0, ..."
    re.compile(r"\bProcess rank: -?\d+, world size: (\d+), device: "),
    # ms-swift: "[INFO:swift] rank: 0, local_rank: 0, world_size: 4, local_world_size: 2"
    re.compile(r"\[INFO:swift\] rank: -?\d+, local_rank: -?\d+, world_size: (\d+), local_world_size: "),
    # torchrun's agent at LOGLEVEL=INFO, its rendezvous result: one entry per local worker.
    re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ \S+\] +global_world_sizes=\[(\d+)(?:, \d+)*\]\s*$"),
    # Script jobs: the line alone, "world_size=4" or "rank 3: world_size=4" (docs: health).
    re.compile(r"^(?:rank \d+: )?world_size=(\d+)\s*$"),
)


def read_world_size(line: str) -> int | None:
    """The world size a rank (or its torchrun) reports having joined, if this line says it
    in one of the anchored forms of WORLD_LINES."""
    text = TEE_PREFIX.sub("", line.rstrip("\r\n"), count=1)
    for pattern in WORLD_LINES:
        m = pattern.search(text)
        if m:
            return int(m.group(1))
    return None


def whole_line(line: str) -> str:
    """A line of torchrun's --tee copy with the header torchrun put inside it taken out.
    torchrun's tail reads a rank's file by lines: at the file's end it takes a line the rank is
    still writing (print()'s text before its "\\n", a write across a page) and copies it in
    two pieces, each behind the header, so the line reads "[default0]:{'loss': 1.2}[default0]:"
    or is cut in its middle; its own header inside it is never the rank's text."""
    m = TEE_PREFIX.match(line)
    if m is None or m.group(0) not in line[m.end():]:
        return line
    return m.group(0) + line[m.end():].replace(m.group(0), "")

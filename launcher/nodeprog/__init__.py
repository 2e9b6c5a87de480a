"""Node programs: standard-library-only Python that mlaunch runs on the nodes.

Every program here travels the same way: its own source text, sent by `script()` inside a
shell here-document to the node's interpreter (no file to install, nothing to import
there). Templates hold shell and config text only. checkpoints and outdir are also
imported by the launcher itself (the same code reads the answers it prints).
"""
from __future__ import annotations

import os

HERE = os.path.dirname(os.path.abspath(__file__))


def source(name: str) -> str:
    """The text of node program `name` (facts, mesh, collective, checkpoints, outdir)."""
    with open(os.path.join(HERE, f"{name}.py"), encoding="utf-8") as fh:
        return fh.read().rstrip("\n")


def script(python: str, name: str, args: list[str]) -> str:
    """Shell text that runs node program `name` with `python` and argv args."""
    from .. import render
    return render.python_script(python, source(name), args)

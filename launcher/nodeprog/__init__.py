"""Node programs: standard-library-only Python that mlaunch runs on the nodes.

Every program here travels the same way: its own source text, sent by `script()` inside a
shell here-document to the node's interpreter (no file to install, nothing to import
there). Templates hold shell and config text only. checkpoints and outdir are also
imported by the launcher itself (the same code reads the answers it prints).

A program may share code with a sibling *part* (ports, inputs, ckpt_checks, wrapped): it imports it
with one top-level `from .part import ...` statement, which `source()` replaces by the part's
text, so what is sent is still one self-contained program. Parts are plain modules of this
package too (the launcher and the tests import them), import no other part, and a
`from __future__` line in a part must stand in the program too (it has to lead the text).

May import: render (for the here-document around a program). The programs themselves import
the standard library only.
"""
from __future__ import annotations

import functools
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))


# A top-level `from .part import ...` (one line, or parenthesised over several) and a
# `from __future__` line: found by their text at column 0, which in these files (no such line
# inside a string) is what Python's parser finds, at a fraction of its cost per submit.
_PART = re.compile(r"^from \.(\w+) import (?:\([^)]*\)|.*)$", re.M)
_FUTURE = re.compile(r"^from __future__ import .*$", re.M)


@functools.lru_cache(maxsize=None)
def source(name: str) -> str:
    """The text of node program `name` (facts, mesh, collective, checkpoints, outdir,
    relay), its parts inlined where it imports them. Made once per program and process: the
    preflight renders one probe per node, which at many nodes added up."""
    text = _read(name)
    out, pos, seen = [], 0, set()
    for m in _PART.finditer(text):   # a part imported twice stands at its first import
        out.append(text[pos:m.start()])
        pos = m.end()
        if m.group(1) in seen:
            pos += 1   # the statement's line goes, with its line break
        else:
            out.append(_part(m.group(1), text))
        seen.add(m.group(1))
    return "".join(out) + text[pos:]


def script(python: str, name: str, args: list[str]) -> str:
    """Shell text that runs node program `name` with `python` and argv args."""
    from .. import render
    return render.python_script(python, source(name), args)


def _read(name: str) -> str:
    with open(os.path.join(HERE, f"{name}.py"), encoding="utf-8") as fh:
        return fh.read().rstrip("\n")


def _part(name: str, program: str) -> str:
    """Part `name`'s text for inlining: its `from __future__` lines dropped (the program's own
    lead the whole text; a part's future import the program lacks is refused)."""
    text = _read(name)
    if _PART.search(text):
        raise ValueError(f"node program part {name} imports another part")
    for m in reversed(list(_FUTURE.finditer(text))):
        if m.group(0) not in program.split("\n"):
            raise ValueError(f"node program part {name} has `{m.group(0)}`; the program needs it too")
        text = text[:m.start()] + text[m.end() + 1:]
    return text

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

import ast
import functools
import os

from .. import pyparse

HERE = os.path.dirname(os.path.abspath(__file__))


@functools.lru_cache(maxsize=None)
def source(name: str) -> str:
    """The text of node program `name` (facts, mesh, collective, checkpoints, outdir,
    relay), its parts inlined where it imports them. Made once per program and process: the
    preflight renders one probe per node, which at many nodes added up."""
    text = _read(name)
    lines, seen, swaps = text.split("\n"), set(), []
    for node in _part_imports(pyparse.parse(text)):   # a part imported twice stands at its first import
        swaps.append((node, [] if node.module in seen else [_part(node.module, text)]))
        seen.add(node.module)
    for node, part in reversed(swaps):
        lines[node.lineno - 1:node.end_lineno] = part
    return "\n".join(lines)


def script(python: str, name: str, args: list[str]) -> str:
    """Shell text that runs node program `name` with `python` and argv args."""
    from .. import render
    return render.python_script(python, source(name), args)


def _read(name: str) -> str:
    with open(os.path.join(HERE, f"{name}.py"), encoding="utf-8") as fh:
        return fh.read().rstrip("\n")


def _part_imports(tree: ast.Module) -> list[ast.ImportFrom]:
    """The top-level `from .part import ...` statements, in file order."""
    return [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 1]


def _part(name: str, program: str) -> str:
    """Part `name`'s text for inlining: its `from __future__` lines dropped (the program's own
    lead the whole text; a part's future import the program lacks is refused)."""
    text = _read(name)
    tree = pyparse.parse(text)
    if _part_imports(tree):
        raise ValueError(f"node program part {name} imports another part")
    lines = text.split("\n")
    for n in reversed([n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]):
        line = "\n".join(lines[n.lineno - 1:n.end_lineno])
        if line not in program.split("\n"):
            raise ValueError(f"node program part {name} has `{line}`; the program needs it too")
        del lines[n.lineno - 1:n.end_lineno]
    return "\n".join(lines)

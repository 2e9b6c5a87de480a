"""Python's own parser, one call at a time.

CPython before 3.11.8 / 3.12.1 keeps the AST converter's recursion depth per interpreter,
not per thread: two threads in ast.parse or ast.literal_eval at once can raise
SystemError("AST constructor recursion depth mismatch"). The launcher parses in several
threads (each node's reader parses the trainer's dict lines), so every parse goes through
one lock here.
"""
from __future__ import annotations

import ast
import threading

_ONE = threading.Lock()


def literal_eval(text: str):
    with _ONE:
        return ast.literal_eval(text)

"""launcher/pyparse.py: the launcher's parses from many threads at once all succeed.

CPython 3.11.7 (this machine's) raised SystemError("AST constructor recursion depth
mismatch") when two threads parsed at once: a Ray node's start failed that way in CI while
other nodes' starts assembled their node programs.
"""
from __future__ import annotations

import threading

from launcher import nodeprog, pyparse


def test_parses_from_many_threads_at_once_all_succeed():
    text = repr({"loss": 1.5, "nested": [{"a": [1, 2, {"b": (3, 4)}]}] * 20, "step": 7})
    want = pyparse.literal_eval(text)
    errors, done = [], []

    def work():
        try:
            for _ in range(100):
                assert pyparse.literal_eval(text) == want
                nodeprog.source("relay")
            done.append(1)
        except Exception as e:  # noqa: BLE001  (any failure is the finding)
            errors.append(repr(e))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(done) == 8

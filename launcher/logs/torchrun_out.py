"""What torchrun itself prints around its workers' lines: the worker's real exit code in its
"Root Cause" report. (The SignalException tracebacks it prints once mlaunch tears a job down
never reach the console: the console stops showing node output when the teardown begins.)"""
from __future__ import annotations

import re
from .stream import lines_of


ROOT_CAUSE = "Root Cause"   # its report's header holds this, the exit code some lines below
ROOT_CAUSE_LINES = 12       # the report's lines after its header, more than it has


class TorchrunRootCause:
    """Remembers the worker exit code from torchrun's failure report.

    torchrun itself exits 1 whatever its worker returned; the "Root Cause" block it prints
    holds the code the user's program really exited with.
    """

    _HEADER = re.compile(r"Root Cause \(first observed failure\)")
    _CODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")

    def __init__(self) -> None:
        self._in_block = False
        self.code: int | None = None

    def see_text(self, text: str) -> None:
        """Take in a text of whole lines (LineSplitter.feed_text)."""
        # One scan of the chunk instead of a regex per line, outside the block.
        if not self._in_block and ROOT_CAUSE not in text:
            return
        for line in lines_of(text):
            if self._HEADER.search(line):
                self._in_block = True
            elif self._in_block and (m := self._CODE.match(line)):
                code = int(m.group(1))
                self.code = 128 - code if code < 0 else code
                self._in_block = False

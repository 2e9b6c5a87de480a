"""What torchrun itself prints around its workers' lines: the worker's real exit code in its
"Root Cause" report, and the SignalException tracebacks it prints once mlaunch tears a job
down (kept off the console, left in the node logs)."""
from __future__ import annotations

import re
from typing import Callable

from .stream import TORCHRUN_PREFIX, lines_of, text_of


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

    def see(self, lines: list[str]) -> None:
        self.see_text(text_of(lines))

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


class SignalTracebacks:
    """Holds back, from the console only, the tracebacks torchrun prints when mlaunch's own
    teardown signals it (`SignalException: Process N got signal: 15`, two chained per agent):
    they look like a crash and are the teardown working. The node log keeps them whole.

    A traceback seen once `active()` is true is buffered to its end (the first line outside
    a traceback's shape); it is dropped when its last exception is a SignalException and
    printed as it was otherwise, so a real failure during teardown still shows."""

    _CHAIN = ("During handling of the above exception, another exception occurred:",
              "The above exception was the direct cause of the following exception:")
    # An exception's last line: a dotted name, or a name like ValueError, then its message.
    _EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*(?:\.\w+)+|\w*(?:Error|Exception|Interrupt|Exit|Warning))"
                            r"(?:: .*)?$")

    def __init__(self, active: Callable[[], bool]):
        self.active = active
        self.folded = 0
        self._block: list[str] = []

    def filter_text(self, text: str) -> str:
        """filter() on a text of whole lines; as it is, without a look, outside a teardown."""
        if not self._block and not self.active():
            return text
        return text_of(self.filter(lines_of(text)))

    def filter(self, lines: list[str]) -> list[str]:
        """The lines to print now."""
        out: list[str] = []
        for line in lines:
            if self._block:
                if TORCHRUN_PREFIX.match(line):   # a worker's line between the agent's: not ours
                    out.append(line)
                    continue
                if self._inside(line):
                    self._block.append(line)
                    continue
                out += self._close()
            if line.startswith("Traceback (most recent call last):") and self.active():
                self._block = [line]
            else:
                out.append(line)
        return out

    def flush(self) -> list[str]:
        """What is still held at the end of the stream."""
        return self._close() if self._block else []

    def _inside(self, line: str) -> bool:
        return (not line.strip() or line[0] in " \t" or line in self._CHAIN
                or line.startswith("Traceback (most recent call last):")
                or bool(self._EXCEPTION.match(line)))

    def _close(self) -> list[str]:
        block, self._block = self._block, []
        last = next((x for x in reversed(block) if x.strip() and x[0] not in " \t"), "")
        if "SignalException" in last and "got signal" in last:
            self.folded += 1
            return []
        return block

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


EXIT_BARRIER = "Error waiting on exit barrier"   # torchrun's agent, logged with its traceback
BARRIER_LINE = ("torchrun's agent could not reach the exit barrier after this node's workers "
                "had finished (the agent holding the rendezvous store had already ended): "
                "harmless to the run; its traceback is in the node log\n")
_TRACE_CONT = ("Traceback (most recent call last)", "The above exception", "During handling")


class ExitBarrierNoise:
    """Takes torchrun's exit-barrier traceback out of one node's console text.

    An agent whose workers have finished waits for every other agent at an exit barrier held
    in the rendezvous store; when the store's host (node 0's agent) ends first, the others
    log "Error waiting on exit barrier" with a traceback, in runs that succeeded too. The
    console shows one line instead (BARRIER_LINE); the node log keeps every line. torch's
    logging repeats the record's header ("E1205 ... api.py:1008] ") on each of its lines; a
    record without one ends at its traceback's last line. State crosses chunks: a block may be
    split between two reads.
    """

    def __init__(self) -> None:
        self._prefix: str | None = None   # inside a block: its lines' header ("" for none)
        self._state = "out"   # out, head (its first line seen), in (its traceback), after (its last line)

    def filter(self, text: str) -> str:
        """text (whole lines) without the block; its one line in the block's place."""
        if self._state == "out" and EXIT_BARRIER not in text:
            return text
        return "".join(self._line(ln) for ln in text.splitlines(keepends=True))

    def _line(self, line: str) -> str:
        bare = line.rstrip("\r\n")
        if self._state == "out":
            if EXIT_BARRIER not in bare:
                return line
            self._prefix, self._state = bare[:bare.index(EXIT_BARRIER)], "head"
            return BARRIER_LINE
        if self._prefix:   # every line of the record starts with its header
            if bare.startswith(self._prefix) and EXIT_BARRIER not in bare:
                return ""
            self._state = "out"
            return self._line(line)
        return self._bare_record(line, bare)

    def _bare_record(self, line: str, bare: str) -> str:
        if self._state == "head" and not bare.startswith(_TRACE_CONT[0]):   # logged without one
            self._state = "out"
            return self._line(line)
        if not bare.strip() or bare.startswith((" ", "\t")) or bare.startswith(_TRACE_CONT):
            self._state = "in"
            return ""
        if self._state == "in":   # the exception's own line ends a traceback
            self._state = "after"
            return ""
        self._state = "out"       # after: any other line ends the block
        return self._line(line)

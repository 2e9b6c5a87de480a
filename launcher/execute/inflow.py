"""A node's output as the node wrote it, whether nodeprog/zpipe.py compressed it on the way
or not: zpipe's header switches inflating on, anything else is passed on as it is."""
from __future__ import annotations

import zlib
from typing import Callable

from ..nodeprog.zpipe import MAGIC   # zpipe's first bytes
MAX_OUT = 8 * 2**20               # inflated bytes per call at most: a bound on memory


class Inflow:
    """Feed it the session's chunks; take the node's own bytes back."""

    def __init__(self) -> None:
        self._head = b""                  # the first bytes, until they tell which stream this is
        self._z: zlib._Decompress | None = None
        self._raw = False

    def pull(self, read: Callable[[], bytes]) -> bytes:
        """The node's next bytes, calling read() for the session's chunks (b"" at the end)."""
        while not (out := self.more()):
            data = read()
            if not data:
                return self.end()
            if out := self.feed(data):
                return out
        return out

    def feed(self, data: bytes) -> bytes:
        """The node's bytes that data completes (b"" when none yet)."""
        if self._raw:
            return data
        if self._z is not None:
            return self._z.decompress(data, MAX_OUT)
        head = self._head + data
        if len(head) < len(MAGIC) and MAGIC.startswith(head):
            self._head = head
            return b""
        self._head = b""
        if head.startswith(MAGIC):
            self._z = zlib.decompressobj()
            return self._z.decompress(head[len(MAGIC):], MAX_OUT)
        self._raw = True
        return head

    def more(self) -> bytes:
        """What is left of the last chunk past MAX_OUT (b"" when nothing is)."""
        if self._z is None or not self._z.unconsumed_tail:
            return b""
        return self._z.decompress(self._z.unconsumed_tail, MAX_OUT)

    def end(self) -> bytes:
        """The rest at end of stream: a header cut short is output, a stream cut short ends."""
        if self._z is not None:
            return self._z.flush()
        head, self._head = self._head, b""
        return head

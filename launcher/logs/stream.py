"""Turning each node's byte stream into whole, prefixed, masked lines and per-node log files."""
from __future__ import annotations

import codecs
import functools
import io
import os
import re
import shutil
import sys
import threading
import time
from typing import Callable, TextIO

from ..record import fsmode
from ..record.events import said_removed

# torchrun --tee prefixes each worker line with "[<role><local_rank>]:"
TORCHRUN_PREFIX = re.compile(r"^\[([A-Za-z_]*?)(\d+)\]:")
PROGRESS_EVERY = 2.0  # seconds between echoed frames of a carriage-return progress bar
# The longest line kept whole (the relay's piece, nodeprog/relay.py's HOLD): a rank that prints
# without a line break, or a bar that only ever writes "\r", must not grow the pending text
# without bound (each chunk re-copied it: 128 MiB took 15 s and held it all).
LINE_CAP = 1 << 20
COLORS = ["36", "33", "35", "32", "34", "31", "96", "93"]


class LineSplitter:
    """Bytes in, complete lines out; never a torn line. A progress bar redraws with a bare
    "\\r": only the final frame of a line is kept, plus one every PROGRESS_EVERY seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._clock = clock
        self._last_frame = clock()

    def feed(self, data: bytes) -> list[str]:
        """Lines completed by data, without their line endings."""
        return lines_of(self.feed_text(data))

    def feed_text(self, data: bytes) -> str:
        """The lines completed by data as one text, each ending in "\n" ("" for none): the
        readers' form, which costs no object per line."""
        text = self._pending + self._decoder.decode(data)
        cut = text.rfind("\n") + 1
        block, self._pending = text[:cut], text[cut:]
        # Fast path: plain "\n" output (the common, high-volume case) needs no frame logic.
        if "\r" in block:
            block = "".join(_last_frame(p) + "\n" for p in lines_of(block))
        if len(self._pending) > LINE_CAP:
            block += self._pieces()
        frame = self._progress_frame() if "\r" in self._pending else None
        return block if frame is None else block + frame + "\n"

    def _pieces(self) -> str:
        """An endless line bounded: a carriage-return bar keeps its last two frames (the one
        echoed and the one being drawn); what is still over LINE_CAP goes on as lines of
        LINE_CAP characters, as the relay passes such a line on."""
        p = self._pending
        if (last := p.rfind("\r")) > 0:
            p = p[max(p.rfind("\r", 0, last), 0):]
        out = []
        while len(p) > LINE_CAP:
            # after a blank near the cap where there is one: the node's relay masked each
            # secret already; a cut between words keeps one whole for the mask here as well
            cut = max(p.rfind(" ", LINE_CAP - 4096, LINE_CAP), p.rfind("\t", LINE_CAP - 4096, LINE_CAP)) + 1
            cut = cut or LINE_CAP
            out.append(_last_frame(p[:cut]) + "\n")
            p = p[cut:]
        self._pending = p
        return "".join(out)

    def flush(self) -> list[str]:
        """Whatever is left at end of stream, as a final line."""
        return lines_of(self.flush_text())

    def flush_text(self) -> str:
        """flush() as feed_text() gives lines."""
        rest = _last_frame(self._pending + self._decoder.decode(b"", final=True))
        self._pending = ""
        return rest + "\n" if rest else ""

    def _progress_frame(self) -> str | None:
        # Pending text holding "\r" has finished frames; echo the newest one now and then.
        if "\r" not in self._pending.rstrip("\r") or self._clock() - self._last_frame < PROGRESS_EVERY:
            return None
        self._last_frame = self._clock()
        head, _, _ = self._pending.rpartition("\r")
        return head.rpartition("\r")[2] or None


def lines_of(text: str) -> list[str]:
    """The lines of a text whose every line ends in "\n", without their endings."""
    return text[:-1].split("\n") if text else []


def text_of(lines: list[str]) -> str:
    """lines as one text, each ending in "\n" (lines_of's inverse)."""
    return "".join(line + "\n" for line in lines)


def _last_frame(line: str) -> str:
    line = line.rstrip("\r")
    return line.rpartition("\r")[2]


class Printer:
    """The one writer to the terminal: whole lines, a node/host(/local rank) prefix, a lock."""

    def __init__(self, mask: Callable[[str], str], out: TextIO | None = None,
                 color: bool | None = None):
        self.out = out or sys.stdout
        self.color = self.out.isatty() if color is None else color
        self.mask = mask
        self._lock = threading.Lock()
        self._status: Callable[[int], list[str]] | None = None
        self._shown = 0   # status lines now on the screen, below the stream
        self._cut: set[tuple[int, str]] = set()   # (node, local rank) whose last line was cut

    @property
    def live(self) -> bool:
        """A terminal that can take status lines redrawn in place."""
        return self.out.isatty() and os.environ.get("TERM", "") != "dumb" \
            and os.environ.get("MLAUNCH_LIVE", "1") != "0"

    def set_status(self, lines: Callable[[int], list[str]] | None) -> None:
        """Keep the lines that `lines(width)` returns under the stream (on a terminal only)."""
        if lines is None:
            with self._lock:
                self._erase()
                self.out.flush()
        self._status = lines if lines is None or self.live else None

    def redraw(self) -> None:
        """Draw the status lines again with fresh figures."""
        if self._status is not None:
            self._write("")

    def _write(self, text: str) -> None:
        # Erase the status block, write the stream's text where it was, draw the block below.
        with self._lock:
            self._erase()
            if text:
                self.out.write(text)
            if self._status is not None:
                rows = self._status(self._width())
                self._screen("".join(f"\033[2m{self.mask(r)}\033[0m\n" for r in rows))
                self._shown = len(rows)
            self.out.flush()

    def _screen(self, text: str) -> None:
        # Status lines and their erasure go to the terminal only, never into a console log.
        getattr(self.out, "terminal_only", self.out.write)(text)

    def _width(self) -> int:
        # The terminal's own size first: COLUMNS in the environment may be stale.
        try:
            return os.get_terminal_size(self.out.fileno()).columns
        except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
            return shutil.get_terminal_size((120, 24)).columns

    def _erase(self) -> None:
        if self._shown:
            self._screen(f"\033[{self._shown}F\033[J")   # up to the block's first line, clear below
            self._shown = 0

    def node_lines(self, rank: int, host: str, lines: list[str]) -> None:
        """Print lines from one node, each prefixed."""
        self.node_text(rank, host, text_of(lines))

    def node_text(self, rank: int, host: str, text: str, masked: bool = False) -> None:
        """node_lines() for a text of whole lines (masked: plan.mask was applied already)."""
        if not text:
            return
        if "[" in text and (text[0] == "[" or "\n[" in text):  # torchrun's local-rank tags
            # A tag inside a line (torchrun_pieces) is rare: two counts tell that no "]:" is
            # past the lines' own tags, and whole lines take one match each.
            whole = not self._cut and text.count("]:") <= text.count("\n[") + 1
            fn = self._whole_prefixed if whole else self._prefixed
            text = "".join([fn(rank, host, line) for line in lines_of(text)])
        else:  # the high-volume case: one replace, no per-line work
            head = self._tag(rank, f"node{rank} {host}")
            text = head + text[:-1].replace("\n", "\n" + head) + "\n"
        self._write(text if masked else self.mask(text))

    def raw_lines(self, lines: list[str]) -> None:
        """Lines printed as they are (a console log that already has its prefixes)."""
        self._write(self.mask(text_of(lines)))

    def say(self, line: str) -> None:
        """A launcher message (not from a node)."""
        tag = "\033[1mmlaunch\033[0m" if self.color else "mlaunch"
        self._write(self.mask(f"[{tag}] {line}\n"))

    def _whole_prefixed(self, rank: int, host: str, line: str) -> str:
        m = TORCHRUN_PREFIX.match(line)
        tag = f"node{rank} {host}" + (f" local{m.group(2)}" if m else "")
        body = line[m.end():].lstrip(" ") if m else line
        return f"{self._tag(rank, tag)}{body}\n"

    def _prefixed(self, rank: int, host: str, line: str) -> str:
        m = TORCHRUN_PREFIX.match(line)
        if not m:
            return f"{self._tag(rank, f'node{rank} {host}')}{line}\n"
        return "".join([self._worker_line(rank, host, local, body, cut)
                        for local, body, cut in torchrun_pieces(line, m)])

    def _worker_line(self, rank: int, host: str, local: str, body: str, cut: bool) -> str:
        # A rank's line that torchrun cut (torchrun_pieces) ends with its own tagged "\n" later:
        # that empty line is the cut line's end, not a line the rank printed.
        key = (rank, local)
        if key in self._cut:
            self._cut.discard(key)
            if not body:
                return ""
        if cut:
            self._cut.add(key)
        return f"{self._tag(rank, f'node{rank} {host} local{local}')}{body.lstrip(' ')}\n"

    def _tag(self, rank: int, tag: str) -> str:
        if self.color:
            return f"\033[{COLORS[rank % len(COLORS)]}m[{tag}]\033[0m "
        return f"[{tag}] "


def torchrun_pieces(line: str, m: re.Match) -> list[tuple[str, str, bool]]:
    """A torchrun --tee line (m: its tag) as (local rank, text, cut) pieces, most often one.

    torchrun's tail threads readline() each rank's log, which returns a part of a line written
    before its "\n"; the rest follows with the tag again, maybe after another rank's line:
    "[default0]:A[default1]:B" then "[default0]:". Such a line is split at each tag of the same
    role; cut: the piece ended where a tag began. Consecutive pieces of one rank are joined."""
    role, local, start = m.group(1), m.group(2), m.end()
    if line.find("[" + role, start) < 0:          # the common case: one whole line
        return [(local, line[start:], False)]
    pieces: list[tuple[str, str, bool]] = []
    for t in _role_tag(role).finditer(line, start):
        pieces.append((local, line[start:t.start()], True))
        local, start = t.group(1), t.end()
    pieces.append((local, line[start:], False))
    joined: list[tuple[str, str, bool]] = []
    for local, text, cut in pieces:
        if joined and joined[-1][0] == local and joined[-1][2]:
            text = joined.pop()[1] + text
        joined.append((local, text, cut))
    return joined


@functools.lru_cache(maxsize=8)
def _role_tag(role: str) -> re.Pattern:
    return re.compile(r"\[" + re.escape(role) + r"(\d+)\]:")


class NodeLog:
    """One node's log file and its one writer: masked texts appended, or a spool's bytes moved
    in with sendfile(2) (which an O_APPEND file refuses: the writer keeps its own offset). A log
    removed with its directory is made again; one that cannot be written is said once, and the
    node's output from there on is on the console only (fd is then -1)."""

    def __init__(self, path: str):
        self.path, self._failed = path, False
        self.fd = self._open()

    def write(self, text: str) -> None:
        """Append a text of whole lines that plan.mask has already been applied to."""
        data = memoryview(text.encode("utf-8", "replace"))
        try:
            while data and self._reopen_if_removed():   # a regular file takes it all at once
                data = data[os.write(self.fd, data):]
        except OSError as e:
            self._fail(e)

    def move(self, spool) -> int:
        """Move a spool's next bytes in (transport/spool.py); how many (1 where it failed)."""
        try:
            return spool.move_to(self.fd) if self._reopen_if_removed() else 1
        except OSError as e:
            self._fail(e)
            return 1

    def _open(self) -> int:
        try:
            fd = fsmode.private_fd(self.path, os.O_WRONLY)
            os.lseek(fd, 0, os.SEEK_END)
            return fd
        except OSError as e:
            self._fail(e)
            return -1

    def _reopen_if_removed(self) -> bool:
        # One fstat a write: a log removed with its directory would take every later line
        # into an unlinked file; it is made again at its path instead.
        if self.fd >= 0 and os.fstat(self.fd).st_nlink == 0:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            said_removed(os.path.dirname(self.path) or ".")
            self.close()
            self.fd = self._open()
        return self.fd >= 0

    def _fail(self, e: OSError) -> None:
        # A full disk or a lost directory must not lose the node.
        self.close()
        if not self._failed:
            self._failed = True
            print(f"mlaunch: cannot write {self.path} ({e.strerror or e}); the run goes on, "
                  "that node's output from here on is only on the console", flush=True, file=sys.stderr)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

"""A node's output relayed for the log path that never copies it through the launcher's Python
(python3 -c, argv: the command; execute/spliced.py is the launcher's side).

Before the command starts, one frame on stdin (a length line, then that many bytes of JSON)
says what to mask and what the launcher must see: {"literal": [[value, mark]...], "regex":
[[pattern, replacement, gate...]...], "marks": [...], "after": [[mark, lines]...], "sample":
marker}. The secrets' values travel there, in no argv and no file.

stdout: everything the command printed, secrets masked, sample lines taken out: the launcher
splices it into the node log unread. stderr: a copy of every line that holds a mark (and the
`lines` after an `after` mark, and every sample line), each behind a 0x1f byte, "\\r" frames
as lines of their own: what the health watch, the root cause and the live view read. The
OpenSSH client's own words on that stderr have no 0x1f, so the two never mix.

As zpipe.py, through the part wrapped.py: the command runs as a child in a session of its
own, stdin inherited (the hang-up guard's heartbeat and the script), this process never a
teardown's target; the exit is the command's. Plain bytes throughout: a chunk without a mark
costs a few C-level scans.
"""
import fcntl
import json
import os
import re
import sys
import time

from .wrapped import end_as, send, spawn

READ = 1 << 18
# A read of less than GATHER waits GATHER_S before the next: the command's pipe (made PIPE
# deep) fills meanwhile, so a flood is relayed in a few large blocks (a read, the scans, a
# write each) rather than in the command's 4-8 KB writes. The command never waits: at
# 100 MB/s it fills half the pipe in those 5 ms.
PIPE, GATHER, GATHER_S = 1 << 20, 1 << 16, 0.005
HOLD = 1 << 20   # a line longer than this without an end goes out as it is
OURS = b"\x1f"   # leads every line this program writes to stderr


def read_frame():
    """The config frame from stdin, read byte by byte up to its length line and then exactly,
    so that what follows (the script, the heartbeats) stays for the command."""
    head = b""
    while not head.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            sys.exit(97)
        head += byte
    size, data = int(head), b""
    while len(data) < size:
        more = os.read(0, size - len(data))
        if not more:
            sys.exit(97)
        data += more
    return json.loads(data.decode("utf-8"))


class Relay:
    """Masks a block of whole lines and picks out what the launcher must see."""

    def __init__(self, config):
        self.literal = [(v.encode(), m.encode()) for v, m in config.get("literal", [])]
        self.regex = [(re.compile(p.encode()), r.encode(), [g.encode() for g in gates])
                      for p, r, *gates in config.get("regex", [])]
        self.after = {m.encode(): n for m, n in config.get("after", [])}
        self.marks = tuple(m.encode() for m in config.get("marks", [])) + tuple(self.after)
        self.sample = config.get("sample", "").encode()
        self.follow = 0   # lines still to copy after an `after` mark
        self.overlap = max([256] + [len(v) for v, _ in self.literal])

    def mask(self, block):
        for value, mark in self.literal:
            if value in block:
                block = block.replace(value, mark)
        for pattern, repl, gates in self.regex:
            if all(g in block for g in gates):
                block = pattern.sub(repl, block)
        return block

    def split(self, block):
        """(the bytes for the node log, the lines for the launcher) of a masked block."""
        if not self.follow and not any(m in block for m in self.marks) and \
                not (self.sample and self.sample in block):
            return block, b""
        seen, lines = [], block.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        for line in lines[:-1] if not lines[-1] else lines:
            if self.follow:
                self.follow -= 1
                seen.append(OURS + line + b"\n")
            elif any(m in line for m in self.marks) or (self.sample and self.sample in line):
                seen.append(OURS + line + b"\n")
            for mark, n in self.after.items():
                if mark in line:
                    self.follow = n
        if self.sample and self.sample in block:
            block = self._without_samples(block)
        return block, b"".join(seen)

    def _without_samples(self, block):
        # A sample may land inside a line the job had not finished: that head stays.
        lines = block.split(b"\n")   # the last item: what follows the last "\n" (mostly b"")
        kept = []
        for line in lines[:-1]:
            head, mark, _ = line.partition(self.sample)
            if not mark or head:
                kept.append((head if mark else line) + b"\n")
        last = lines[-1].partition(self.sample)[0]
        return b"".join(kept) + last


def pump(relay, fd):
    """Relay the command's output until every writer has closed it."""
    rest = b""
    try:
        fcntl.fcntl(fd, 1031, PIPE)   # F_SETPIPE_SZ (Linux)
    except OSError:
        pass   # the pipe keeps its size
    small = False
    while True:
        if small:
            time.sleep(GATHER_S)
        data = os.read(fd, READ)
        if not data:
            break
        small = len(data) < GATHER
        data = rest + data
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if not cut and len(data) < HOLD:
            rest = data
            continue
        # A line past HOLD is cut, short of its end by more than a secret is long, so that
        # no secret is cut in two and left unmasked
        cut = cut or len(data) - relay.overlap
        block, rest = data[:cut], data[cut:]
        out, seen = relay.split(relay.mask(block))
        if seen:
            send(2, seen)
        send(1, out)
    if rest:
        out, seen = relay.split(relay.mask(rest + b"\n"))
        if seen:
            send(2, seen)
        send(1, out[:-1] if out.endswith(b"\n") else out)


def main():
    relay = Relay(read_frame())
    child = spawn(sys.argv[1:])
    pump(relay, child.stdout.fileno())
    end_as(child)

if __name__ == "__main__":
    main()

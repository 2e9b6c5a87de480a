"""A node's output relayed on the node (python3 -c, argv: the command; session/nodeoutput.py
is the launcher's side): secrets masked, and the lines the launcher must see copied apart.

Before the command starts, one frame on stdin (a length line, then that many bytes) says what
to mask and what to copy: {"literal": [[value, mark]...], "regex": [[pattern, replacement,
gate...]...], "marks": [...], "after": [[mark, lines]...], "sample": marker}, as
render.relay_frame() writes it (NUL-separated fields: no json to import). The secrets' values
travel there, in no argv and no file.

stdout: everything the command printed, masked, sample lines taken out: the node log's bytes.
stderr: each line that holds a mark (and the `lines` after an `after` mark, and every sample),
behind a 0x1f byte, "\\r" frames as lines of their own: what the health watch, the root cause
and the live view read; the OpenSSH client's own words there have no 0x1f. The command runs as
a child in a session of its own (wrapped.py), stdin inherited; the exit is the command's.
"""
import fcntl
import os
import select
import sys
import time

from .wrapped import end_as, send, spawn
from .cpusample import REQUEST, CpuSampler, asked

READ = 1 << 18
# A read of less than GATHER waits before the next, long enough for about GATHER bytes at
# the rate that read came (GATHER_S to GATHER_MAX_S): the command's pipe (made PIPE deep)
# fills meanwhile, so a flood is relayed in a few large blocks, and a trickle of lines costs
# at most 50 wake-ups a second.
PIPE, GATHER, GATHER_S, GATHER_MAX_S = 1 << 20, 1 << 16, 0.005, 0.02
HOLD = 1 << 20   # a line longer than this without an end goes out as it is
# A quiet output is looked at every WAKE_S: has the command ended? Once it has, what it wrote
# before its end (in the pipe then: a torchrun's workers end before it does) is relayed
# whatever that takes (a slow or loaded link drains a full pipe slowly), and what its
# leftovers still write after it, for AFTER_EXIT_S at most.
WAKE_S, AFTER_EXIT_S = 0.5, 2.0
OURS = b"\x1f"   # leads every line this program writes to stderr


def read_frame():
    """The config frame from stdin, read byte by byte up to its length line and then exactly,
    so that what follows (the script, the heartbeats) stays for the command."""
    head = b""
    while not head.endswith(b"\n"):   # stdin ended early: exit 97
        head += os.read(0, 1) or sys.exit(97)
    size, data = int(head), b""
    while len(data) < size:
        data += os.read(0, size - len(data)) or sys.exit(97)
    return parse_frame(data.decode("utf-8"))


def parse_frame(text):
    """The config of render.relay_frame()'s text: kind, field count, fields, ... NUL-separated."""
    config, fields, at = {}, text.split("\0") if text else [], 0
    while at < len(fields):
        kind, n = fields[at], int(fields[at + 1])
        entry = fields[at + 2:at + 2 + n]
        at += 2 + n
        if kind == "sample":
            config["sample"] = entry[0]
        elif kind == "marks":
            config.setdefault(kind, []).append(entry[0])
        else:   # literal, regex, after
            config.setdefault(kind, []).append(entry if kind != "after" else [entry[0], int(entry[1])])
    return config


def in_python(block, needle):
    return needle in block


def by_memmem():
    """A substring test by the C library's memmem (faster than Python's own search for the
    marks), or Python's where ctypes or memmem is missing."""
    try:
        import ctypes
        memmem = ctypes.CDLL(None).memmem
    except (ImportError, OSError, AttributeError):
        return in_python
    memmem.restype = ctypes.c_void_p
    memmem.argtypes = (ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t)
    return lambda block, needle: memmem(block, len(block), needle, len(needle)) is not None


# Python's search until the output passes FAST_AFTER, then memmem: importing ctypes costs more
# CPU than a node that prints a few lines would save.
FAST_AFTER = 1 << 20
# Bytes that fill ordinary log text: a needle holding none of them has a gate, its rarest
# byte, looked for first (a memchr, far cheaper than the search).
COMMON = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                   b" \t\n.,:;/-_=[]()'\"<>")


def needle(text):
    """(the needle's bytes, its gate or None)."""
    data = text.encode()
    return data, next((bytes([b]) for b in data if b not in COMMON), None)


def compiled(pattern, cache={}):
    """pattern compiled, re imported at the first block that needs it: spared on every node
    whose output never holds what a regex masks (a URL's password)."""
    if pattern not in cache:
        import re
        cache[pattern] = re.compile(pattern)
    return cache[pattern]


class Relay:
    """Masks a block of whole lines and picks out what the launcher must see."""

    def __init__(self, config):
        self.literal = [(v.encode(), m.encode()) for v, m in config.get("literal", [])]
        self.regex = [(p.encode(), r.encode(), [g.encode() for g in gates])
                      for p, r, *gates in config.get("regex", [])]
        self.after = {m.encode(): n for m, n in config.get("after", [])}
        self.marks = [needle(m) for m in config.get("marks", [])]
        self.afters = [needle(m) for m, _ in config.get("after", [])]
        self.sample = config.get("sample", "").encode()
        self.sampled = needle(config["sample"]) if self.sample else None
        self.search = in_python   # pump() makes it by_memmem() past FAST_AFTER
        self.follow = 0   # lines still to copy after an `after` mark
        self.cpu = None   # the CPU samples, once the node's sampler asked for them (cpusample.py)
        self.overlap = max([256] + [len(v) for v, _ in self.literal])

    def mask(self, block):
        for value, mark in self.literal:
            if self.search(block, value):
                block = block.replace(value, mark)
        for pattern, repl, gates in self.regex:
            if all(self.search(block, g) for g in gates):
                block = compiled(pattern).sub(repl, block)
        return block

    def safe_cut(self, data, cut):
        """cut moved back to the start of every secret (literal or regex match) that spans
        it, so that masking data[:cut] and then the rest misses none that masking the whole
        would find; cut itself where that would leave nothing before it."""
        start = cut
        moved = True
        while moved and cut > 0:
            moved = False
            for value, _ in self.literal:   # a find in the window holds the cut inside
                at = data.find(value, max(0, cut - len(value) + 1), cut + len(value) - 1)
                if at >= 0:
                    cut, moved = at, True
            for pattern, _, gates in self.regex:
                lo = max(0, cut - self.overlap)
                window = data[lo:cut + self.overlap]
                if all(g in window for g in gates):
                    for m in compiled(pattern).finditer(data, lo, cut + self.overlap):
                        if m.start() < cut <= m.end():   # its context too
                            cut, moved = m.start(), True
                            break
        return cut if cut > 0 else start

    def split(self, block):
        """(the bytes for the node log, the lines for the launcher) of a masked block."""
        sampled = self.sampled is not None and self._holds(block, self.sampled)
        if self.follow or any(self._holds(block, a) for a in self.afters):
            seen = self._by_line(block)
        elif sampled or any(self._holds(block, m) for m in self.marks):
            seen = self._by_mark(block, [m for m, _ in self.marks] +
                                 ([self.sample] if sampled else []))
        else:
            return block, b""
        if sampled:
            block = self._without_samples(block)
        return block, seen

    def _holds(self, block, pair):
        data, gate = pair
        return (gate is None or gate in block) and self.search(block, data)

    def _by_mark(self, block, marks):
        # Only the lines around each mark: a block's thousands of other lines are never
        # cut apart. A line ends at "\n" or "\r" (a progress bar's frames are lines).
        spans = {}
        for mark in marks:
            at = block.find(mark)
            while at >= 0:
                start = block.rfind(b"\n", 0, at) + 1
                start = block.rfind(b"\r", start, at) + 1 or start
                end = block.find(b"\n", at)
                end = len(block) if end < 0 else end
                frame = block.find(b"\r", at, end)
                end = end if frame < 0 else frame
                spans[start] = end
                at = block.find(mark, end)
        return b"".join(OURS + block[s:spans[s]] + b"\n" for s in sorted(spans))

    def _by_line(self, block):
        # An `after` mark is near (torchrun's failure report): line by line, to count them.
        seen, lines = [], block.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        marks = [m for m, _ in self.marks] + ([self.sample] if self.sample else [])
        for line in lines[:-1] if not lines[-1] else lines:
            if self.follow:
                self.follow -= 1
                seen.append(OURS + line + b"\n")
            elif any(m in line for m in marks) or any(a in line for a in self.after):
                seen.append(OURS + line + b"\n")
            for mark, n in self.after.items():
                if mark in line:
                    self.follow = n
        return b"".join(seen)

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


def pump(relay, child):
    """Relay the command's output until every writer has closed it, or AFTER_EXIT_S after the
    command ended: a process it left behind that still holds the output (a cluster.setup
    line's daemon) does not keep the session open."""
    fd, rest = child.fd, b""
    try:
        fcntl.fcntl(fd, 1031, PIPE)   # F_SETPIPE_SZ (Linux)
    except OSError:
        pass   # the pipe keeps its size
    wait, total, cut_at, owed = 0.0, 0, None, 0
    while True:
        if wait:
            time.sleep(wait)
        if cut_at is None and child.poll() is not None:
            cut_at, owed = time.monotonic() + AFTER_EXIT_S, pending(fd)
        if cut_at is not None and owed <= 0 and time.monotonic() >= cut_at:
            break
        if not readable(relay, fd, cut_at):
            wait = 0.0
            continue
        data = os.read(fd, READ)
        if not data:
            break
        total, owed = total + len(data), owed - len(data)
        if total > FAST_AFTER and relay.search is in_python:
            relay.search = by_memmem()
        wait = 0.0 if len(data) >= GATHER else \
            min(GATHER_MAX_S, max(GATHER_S, (wait or GATHER_S) * GATHER / len(data)))
        data = rest + data
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if not cut and len(data) < HOLD:
            rest = data
            continue
        # A line past HOLD is cut short of its end, never inside a secret (safe_cut): the
        # rest, which keeps any secret the cut would split, is masked with what follows.
        cut = cut or relay.safe_cut(data, len(data) - relay.overlap)
        block, rest = data[:cut], data[cut:]
        send(1, relayed(relay, block))
    if rest:
        out = relayed(relay, rest + b"\n")
        send(1, out[:-1] if out.endswith(b"\n") else out)


def pending(fd):
    """How many bytes the pipe fd holds (FIONREAD); 0 where that cannot be asked."""
    try:
        return int.from_bytes(fcntl.ioctl(fd, 0x541B, bytes(4)), sys.byteorder)
    except OSError:
        return 0


def readable(relay, fd, cut_at):
    """Whether fd has bytes (or its end) within WAKE_S (or before cut_at); the CPU samples
    that fall due meanwhile are sent."""
    timeout = WAKE_S
    if relay.cpu is not None:
        timeout = min(timeout, relay.cpu.tick(lambda row: send(2, OURS + row)))
    if cut_at is not None:
        timeout = min(timeout, max(0.0, cut_at - time.monotonic()))
    return bool(select.select([fd], [], [], timeout)[0])


def relayed(relay, block):
    """block masked, its lines for the launcher sent to stderr; what goes to the node log."""
    out, seen = relay.split(relay.mask(block))
    if seen and REQUEST in seen:   # the sampler found no GPU: this relay samples the CPU
        every, seen = asked(seen)
        if every and relay.cpu is None:
            relay.cpu = CpuSampler(every)
    if seen:
        send(2, seen)
    return out


def main():
    relay = Relay(read_frame())
    child = spawn(sys.argv[1:])
    pump(relay, child)
    end_as(child)

if __name__ == "__main__":
    main()

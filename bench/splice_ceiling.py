"""Issue 28's open goal, measured before it is built: what a log path that never copies node
output through the launcher's Python would reach (a design's ceiling, not mlaunch's path).

The design: a relay on each node (python3, as nodeprog/zpipe.py is there already) masks the
secrets in whole lines and copies every line that may matter to the launcher (health
patterns, torchrun's root cause, samples, tracebacks) to its stderr; the bulk goes to stdout.
The launcher moves each `ssh` client's stdout pipe into the node log with splice(2) (no copy
through user space), reads only the stderr lines, and a console thread follows the node logs
at its pace (4 MiB/s, as logs/console.py). Against, in the same runs: plain parallel
`ssh host cmd > file` and mlaunch as it is (bench/logflood.py via_mlaunch).

  python3 bench/splice_ceiling.py --hosts 8 --runs 3      # (as root: namespace hosts)
"""
from __future__ import annotations

import argparse
import os
import resource
import selectors
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from bench.logflood import LINE_BYTES, check, cpu_s, generator, via_mlaunch, via_ssh
from tests.hosts import make_hosts

# The node side: the command's output in, whole lines out; a secret masked; the lines that may
# matter copied to stderr. Plain bytes throughout: each test is a C-level scan of the chunk.
RELAY = r"""
import os, subprocess, sys
SECRET = os.environ.get("RELAY_SECRET", "s3cr3t-value").encode()
MARKS = (b"world", b"{", b"%|", b"Saving model checkpoint", b"Root Cause", b"\x1e", b"Traceback")
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
fd, rest = child.stdout.fileno(), b""
def send(out, data):
    view = memoryview(data)
    while view:
        view = view[os.write(out, view):]
while True:
    data = os.read(fd, 1 << 18)
    if not data:
        break
    data = rest + data
    cut = data.rfind(b"\n") + 1
    block, rest = data[:cut], data[cut:]
    if SECRET in block:
        block = block.replace(SECRET, b"*****")
    if any(m in block for m in MARKS):
        send(2, b"".join(ln + b"\n" for ln in block.split(b"\n") if any(m in ln for m in MARKS)))
    send(1, block)
if rest:
    send(1, rest)
code = child.wait()
sys.exit(code if code >= 0 else 128 - code)
"""
PIPE_BYTES, SPLICE = 2**20, 2**20
CONSOLE_RATE = 4 * 2**20


def via_splice(hs, n: int, lines: int, tmp: str, relay: bool = True) -> tuple[float, tuple, float, int]:
    """Wall seconds, (lost, dup, torn) of the node logs, the launcher's CPU share (this
    process: the splice loop and the console thread) and the bytes the stderr lines held."""
    cmd = generator(lines)
    if relay:
        cmd = f"exec python3 -c {shlex.quote(RELAY)} /bin/sh -c {shlex.quote(cmd)}"
    paths = [os.path.join(tmp, f"node{k}.log") for k in range(n)]
    # splice(2) refuses an O_APPEND file: the launcher is the only writer of a node log here
    logs = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) for p in paths]
    t0, c0 = time.perf_counter(), cpu_s(resource.RUSAGE_SELF)
    procs = [subprocess.Popen(hs.ssh_argv(h, connect_timeout=60) + [cmd], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for h in hs.hosts[:n]]
    sel = selectors.DefaultSelector()
    for k, p in enumerate(procs):
        import fcntl
        fcntl.fcntl(p.stdout.fileno(), 1031, PIPE_BYTES)
        for f, what in ((p.stdout, "out"), (p.stderr, "err")):
            os.set_blocking(f.fileno(), False)
            sel.register(f.fileno(), selectors.EVENT_READ, (k, what))
    done = threading.Event()
    console = threading.Thread(target=_follow, args=(paths, done), daemon=True)
    console.start()
    open_fds, events = 2 * n, 0
    while open_fds:
        for key, _ in sel.select():
            k, what = key.data
            try:
                got = (os.splice(key.fd, logs[k], SPLICE) if what == "out"
                       else len(os.read(key.fd, 1 << 16)))
            except BlockingIOError:
                continue
            if what == "err":
                events += got
            if not got:
                sel.unregister(key.fd)
                open_fds -= 1
    codes = [p.wait() for p in procs]
    done.set()
    console.join()
    elapsed = time.perf_counter() - t0
    share = (cpu_s(resource.RUSAGE_SELF) - c0) / elapsed
    for fd in logs:
        os.close(fd)
    assert codes == [0] * n, codes
    bad = check({k: open(p).read().splitlines() for k, p in enumerate(paths)}, lines)
    return elapsed, bad, share, events


def _follow(paths: list[str], done: threading.Event) -> None:
    """The console's share: every 50 ms, the newest whole lines of each log that the pace
    allows (what it skips stays in the logs), written to /dev/null as a terminal would take."""
    seen = [0] * len(paths)
    out = os.open(os.devnull, os.O_WRONLY)
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    while not done.wait(0.05):
        budget = int(CONSOLE_RATE * 0.05) // len(paths)
        for k, fd in enumerate(fds):
            size = os.fstat(fd).st_size
            start = max(seen[k], size - budget)
            if size > start:
                data = os.pread(fd, size - start, start)
                cut = data.rfind(b"\n") + 1
                os.write(out, data[data.find(b"\n") + 1 if start > seen[k] else 0:cut])
                seen[k] = start + cut
    for fd in fds:
        os.close(fd)
    os.close(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--mb", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    n, lines = args.hosts, args.mb * 1_000_000 // LINE_BYTES
    rows: dict[str, list[tuple[float, float]]] = {"splice+relay": [], "splice": [], "mlaunch": [], "ssh": []}
    with make_hosts(n, isolated_home=True) as hs:
        for _ in range(args.runs):
            for name in rows:
                with tempfile.TemporaryDirectory() as tmp:
                    if name == "ssh":
                        t, bad, cpu = via_ssh(hs, n, lines, tmp)
                        cpu = 0.0   # raw ssh has no launcher: its clients' share is not comparable
                    elif name == "mlaunch":
                        t, bad, cpu, _ = via_mlaunch(hs, n, lines, tmp)
                    else:
                        t, bad, cpu, ev = via_splice(hs, n, lines, tmp, relay=name == "splice+relay")
                assert bad == (0, 0, 0), (name, bad)
                rows[name].append((t, cpu))
                print(f"{name:13s} {t:.2f}s launcher cpu share {cpu:.2f} load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr)
    raw = statistics.median(t for t, _ in rows["ssh"])
    print(f"{n} hosts x {args.mb} MB, {args.runs} runs, medians; ratio = raw parallel ssh s / this s")
    for name, got in rows.items():
        t = statistics.median(x for x, _ in got)
        c = statistics.median(x for _, x in got)
        print(f"  {name:13s} {t:6.2f}s  ratio {raw / t:.2f}  launcher CPU share {c:.2f} of a core"
              f"  (per run: {', '.join(f'{raw_t / x:.2f}' for (x, _), (raw_t, _) in zip(got, rows['ssh']))})")


if __name__ == "__main__":
    main()

"""Line handling of streamed node output: whole lines, progress bars, prefixes, exit codes."""
from __future__ import annotations

import io
import subprocess

import pytest

from launcher.logs.stream import LineSplitter, NodeLog, Printer
from launcher.logs.torchrun_out import TorchrunRootCause

from .helpers import limit


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_lines_are_never_torn_across_chunks():
    s = LineSplitter()
    data = "αβγ line one\nsecond ✓ line\nthird".encode()
    got = []
    for i in range(len(data)):  # one byte at a time: splits multibyte characters too
        got += s.feed(data[i:i + 1])
    assert got == ["αβγ line one", "second ✓ line"]
    assert s.flush() == ["third"]


def test_crlf_and_progress_bars():
    clock = Clock()
    s = LineSplitter(clock)
    assert s.feed(b"a\r\nb\r\n") == ["a", "b"]
    # A progress bar redraws with \r; only its last frame is kept when the line ends.
    assert s.feed(b" 10%\r 20%\r") == []
    clock.t = 5.0  # after PROGRESS_EVERY, the newest finished frame is echoed once
    assert s.feed(b" 30%\r") == [" 30%"]
    assert s.feed(b" 40%\r") == []
    assert s.feed(b"100%\n") == ["100%"]


def test_an_endless_line_goes_on_in_bounded_pieces_and_a_bar_keeps_its_last_frames():
    """A rank printing without a line break: the pending text stays under LINE_CAP (it grew
    with the stream and each chunk re-copied it), nothing is lost, and a cut falls between
    words where there are any near the cap."""
    from launcher.logs.stream import LINE_CAP
    s, got, chunk = LineSplitter(), [], (b"word " * 200_000)[:1 << 20]
    for _ in range(64):   # 64 MiB, no line break
        got += s.feed(chunk)
        assert len(s._pending) <= LINE_CAP
    got += s.flush()
    assert "".join(got) == chunk.decode() * 64
    assert all(len(line) <= LINE_CAP for line in got) and all(line.endswith(" ") for line in got[:-1])
    # a bar that only ever redraws: two frames kept, the last one is the line at the end
    s = LineSplitter(Clock())
    for i in range(300_000):
        s.feed(b"\r%6d/300000 " % i)
    assert len(s._pending) <= LINE_CAP and s.flush() == ["299999/300000 "]


def test_printer_prefixes_node_host_and_local_rank():
    out = io.StringIO()
    p = Printer(lambda t: t.replace("hf_secret", "***"), out, color=False)
    p.node_lines(1, "10.0.0.12", ["[default1]:loss 0.5", "plain", "token hf_secret"])
    assert out.getvalue().splitlines() == [
        "[node1 10.0.0.12 local1] loss 0.5", "[node1 10.0.0.12] plain", "[node1 10.0.0.12] token ***"]
    out2 = io.StringIO()
    Printer(lambda t: t, out2, color=True).node_lines(0, "h", ["x"])
    assert out2.getvalue().startswith("\033[36m[node0 h]\033[0m x")


def test_printer_is_not_coloured_off_tty():
    out = io.StringIO()
    Printer(lambda t: t, out).node_lines(0, "h", ["x"])
    assert out.getvalue() == "[node0 h] x\n"


def test_torchrun_root_cause_exit_code():
    c = TorchrunRootCause()
    c.see_text("Failures:\n  exitcode  : -15 (pid: 1)\nRoot Cause (first observed failure):\n"
               "[0]:\n  exitcode  : 3 (pid: 2)\n")
    assert c.code == 3
    k = TorchrunRootCause()
    k.see_text("Root Cause (first observed failure):\n  exitcode  : -9 (pid: 3)\n")
    assert k.code == 137


def test_text_forms_match_the_line_forms(tmp_path):
    """The readers' text of whole lines: the same lines as the lists."""
    from launcher.logs.stream import lines_of, text_of
    s = LineSplitter()
    assert s.feed_text(b"a\r\nb\n\npart") == "a\nb\n\n" and s.flush_text() == "part\n"
    assert lines_of("a\n\nb\n") == ["a", "", "b"] and text_of(["a", "", "b"]) == "a\n\nb\n"


def test_node_log_appends_and_is_made_again_once_removed(tmp_path):
    (tmp_path / "d").mkdir()
    path = tmp_path / "d" / "n.log"
    path.write_text("old\n")
    log = NodeLog(str(path))
    log.write("x\ny\n")
    assert path.read_text() == "old\nx\ny\n"
    path.unlink()
    (tmp_path / "d").rmdir()
    log.write("z\n")
    log.close()
    assert path.read_text() == "z\n"


def test_torchrun_cut_lines_are_whole_again():
    """torchrun's tail threads print a rank's half-written line, then the rest with the tag
    again; another rank's line can land in between. Each rank's line comes out whole, once."""
    out = io.StringIO()
    p = Printer(lambda t: t, out, color=False)
    p.node_text(0, "h", "[default0]:rank 0 sum 3[default1]:rank 1 sum 3\n[default0]:\n"
                        "[default1]:[rank1]: text with a tag of another role\n"
                        "[default0]:half[default0]: and the rest\n[default0]:\n")
    assert out.getvalue().splitlines() == [
        "[node0 h local0] rank 0 sum 3", "[node0 h local1] rank 1 sum 3",
        "[node0 h local1] [rank1]: text with a tag of another role",
        "[node0 h local0] half and the rest", "[node0 h local0] "]


_TAIL = r"""
import os, sys, threading, time
from torch.distributed.elastic.multiprocessing.tail_log import TailLog
d = sys.argv[1]
files = {i: os.path.join(d, f"{i}.log") for i in (0, 1)}
for f in files.values():
    open(f, "w").close()
class Dst:
    def __init__(self): self.text, self.lock = "", threading.Lock()
    def write(self, s):
        with self.lock: self.text += s
    def flush(self): pass
dst = Dst()
def wait_for(s):
    end = time.monotonic() + 60
    while s not in dst.text:
        assert time.monotonic() < end, dst.text
        time.sleep(0.01)
tail = TailLog("default", files, dst, interval_sec=0.01).start()
with open(files[0], "a") as a, open(files[1], "a") as b:
    a.write("rank 0 sum 3"); a.flush()        # print()'s text, its "\n" not yet written
    wait_for("[default0]:rank 0 sum 3")
    b.write("rank 1 sum 3\n"); b.flush()
    wait_for("[default1]:rank 1 sum 3\n")
    a.write("\n"); a.flush()
    wait_for("[default0]:\n")
tail.stop()
sys.stdout.write(dst.text)
"""


@pytest.mark.training
def test_torchruns_own_tail_threads_cut_a_line_and_the_console_mends_it(tmp_path):
    """The real torch TailLog that torchrun --tee uses, driven into the cut: the console shows
    both ranks' lines whole, each with its own local rank."""
    from .training import TRAINER_PYTHON
    r = subprocess.run([TRAINER_PYTHON, "-c", _TAIL, str(tmp_path)], capture_output=True,
                       text=True, timeout=limit(120))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == "[default0]:rank 0 sum 3[default1]:rank 1 sum 3\n[default0]:\n"
    out = io.StringIO()
    Printer(lambda t: t, out, color=False).node_text(0, "h", r.stdout)
    assert out.getvalue().splitlines() == ["[node0 h local0] rank 0 sum 3",
                                           "[node0 h local1] rank 1 sum 3"]


class _Sink(io.StringIO):
    """A console whose text is read back; isatty() False, so no status lines."""


def _console(rate: float, bound: int):
    from launcher.logs.console import Console
    sink = _Sink()
    return Console(Printer(lambda s: s, sink, color=False), {0: "node0.log"}, bound=bound, rate=rate), sink


def test_console_keeps_its_pace_and_skips_the_oldest_past_its_bound(tmp_path):
    """A log of 2 MB at once, a pace of 1 MB/s and a bound of 1.5 MB: what it printed is never
    more than its pace over the time taken plus one look's read (load only makes it print
    less), the oldest were skipped and the newest are shown at the close."""
    import time
    from launcher.logs.console import TICK_S
    console, sink = _console(rate=2**20, bound=3 * 2**19)
    line = "%06d " + "x" * 93 + "\n"
    path = tmp_path / "node0.log"
    path.write_text("".join(line % k for k in range(20_000)))   # 20,000 lines of 100 bytes
    start = time.monotonic()
    console.follow(0, "h", str(path))
    time.sleep(0.5)   # the console's pace over some time, not a wait for an event
    printed = sink.getvalue().count("\n")
    assert printed * 100 <= 2**20 * (time.monotonic() - start + TICK_S) + 10_000
    console.close(wait_s=limit(10))
    text = sink.getvalue()
    shown = [int(ln.split()[2]) for ln in text.splitlines() if ln.startswith("[node0 h] ")]
    assert shown == sorted(shown) and shown[-1] == 19_999, "the newest line was not shown"
    assert len(shown) < 20_000, "nothing was skipped"
    assert "console behind: skipped" in text, text[-500:]


def test_console_within_its_pace_shows_every_line(tmp_path):
    """Ordinary output (well under the pace): every line, in order, no 'behind' line."""
    console, sink = _console(rate=4 * 2**20, bound=8 * 2**20)
    path = tmp_path / "node0.log"
    path.write_text("".join(f"step {k}\n" for k in range(50)))
    console.follow(0, "h", str(path))
    console.close(wait_s=limit(10))
    assert sink.getvalue() == "".join(f"[node0 h] step {k}\n" for k in range(50))


EXIT_BARRIER_SCRIPT = """
import datetime, types
from torch.distributed import TCPStore
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
server = TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=2), wait_for_workers=False)
client = TCPStore("127.0.0.1", server.port, 2, False, timeout=datetime.timedelta(seconds=2))
del server   # the rendezvous store's host has ended, as node 0's agent may before the others
agent = types.SimpleNamespace(_store=client, _exit_barrier_timeout=1, _worker_group=types.SimpleNamespace(
    group_world_size=2, state="SUCCEEDED"))
print("before", flush=True)
SimpleElasticAgent._exit_barrier(agent)
print("after", flush=True)
"""


def test_torchruns_exit_barrier_traceback_becomes_one_console_line():
    """torch's own agent code fails its exit barrier on a store whose host is gone and logs
    the traceback; the console's filter shows one line for it, whatever the chunking, and
    keeps the lines around it."""
    import subprocess
    import sys
    from launcher.logs.torchrun_out import BARRIER_LINE, ExitBarrierNoise
    raw = subprocess.run([sys.executable, "-c", EXIT_BARRIER_SCRIPT], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=limit(120)).stdout
    assert "Error waiting on exit barrier" in raw and "Traceback" in raw, raw[-2000:]
    lines = raw.splitlines(keepends=True)
    for size in (1, 3, len(lines)):
        f = ExitBarrierNoise()
        shown = "".join(f.filter("".join(lines[i:i + size])) for i in range(0, len(lines), size))
        assert "Traceback" not in shown and "DistNetworkError: " not in shown, shown[-2000:]
        assert shown.count(BARRIER_LINE) == 1
        assert "before\n" in shown and shown.endswith("after\n")


def test_exit_barrier_record_without_a_header_ends_at_its_exception():
    from launcher.logs.torchrun_out import BARRIER_LINE, ExitBarrierNoise
    text = ("step 9\nError waiting on exit barrier. Elapsed: 300 seconds\nTraceback (most recent call last):\n"
            "  File \"a.py\", line 1, in f\n    g()\nDistStoreError: timeout\n\n"
            "The above exception was the direct cause of the following exception:\n\n"
            "Traceback (most recent call last):\n  File \"b.py\", line 2\nRuntimeError: boom\nstep 10\n"
            "Error waiting on exit barrier. Elapsed: 1 seconds\nnext line\n")
    assert ExitBarrierNoise().filter(text) == f"step 9\n{BARRIER_LINE}step 10\n{BARRIER_LINE}next line\n"

"""Line handling of streamed node output: whole lines, progress bars, prefixes, exit codes."""
from __future__ import annotations

import io

from launcher.execute.stream import LineSplitter, NodeLog, Printer, SignalTracebacks, TorchrunRootCause


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
    c.see(["Failures:", "  exitcode  : -15 (pid: 1)", "Root Cause (first observed failure):",
           "[0]:", "  exitcode  : 3 (pid: 2)"])
    assert c.code == 3
    k = TorchrunRootCause()
    k.see(["Root Cause (first observed failure):", "  exitcode  : -9 (pid: 3)"])
    assert k.code == 137


def test_node_log_masks_and_keeps_tail(tmp_path):
    log = NodeLog(str(tmp_path / "n.log"), lambda t: t.replace("s3cr3t", "***"), keep=2)
    log.write(["a", "b s3cr3t", "c"])
    log.close()
    assert (tmp_path / "n.log").read_text() == "a\nb ***\nc\n"
    assert list(log.tail) == ["b ***", "c"]


def _sigterm_lines() -> list[str]:
    import os
    from .helpers import ROOT
    with open(os.path.join(ROOT, "tests", "data", "torchrun-sigterm.log"), encoding="utf-8") as f:
        return f.read().splitlines()


def test_torchruns_signal_tracebacks_are_held_back_once_mlaunch_tears_down():
    """torchrun's real output on mlaunch's SIGTERM: its warnings stay, its two chained
    SignalException tracebacks go (node log only), whatever the chunking."""
    lines = _sigterm_lines()
    assert sum("SignalException: Process" in x for x in lines) == 2
    for size in (1, 7, len(lines)):
        noise = SignalTracebacks(lambda: True)
        shown = []
        for i in range(0, len(lines), size):
            shown += noise.filter(lines[i:i + size])
        shown += noise.flush()
        assert shown == [x for x in lines if x.startswith("W1202")], size
        assert noise.folded == 1


def test_other_tracebacks_and_tracebacks_before_teardown_are_printed():
    lines = _sigterm_lines()
    noise = SignalTracebacks(lambda: False)
    assert noise.filter(lines) == lines and noise.flush() == []
    crash = ["Traceback (most recent call last):", '  File "t.py", line 1, in <module>',
             "ValueError: bad", "[default0]:next worker line", "after"]
    noise = SignalTracebacks(lambda: True)
    assert noise.filter(crash[:2]) == []
    assert noise.filter(crash[2:]) == ["[default0]:next worker line", *crash[:3], "after"]
    noise = SignalTracebacks(lambda: True)
    assert noise.filter(crash[:3]) == [] and noise.flush() == crash[:3]

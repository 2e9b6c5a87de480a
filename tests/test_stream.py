"""Line handling of streamed node output: whole lines, progress bars, prefixes, exit codes."""
from __future__ import annotations

import io

from launcher.execute.stream import LineSplitter, NodeLog, Printer, TorchrunRootCause


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

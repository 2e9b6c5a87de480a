"""`mlaunch logs --tail N` reads only the file's end, a whole-file read goes in bounded chunks,
and `logs -f --tail N` follows on from the end without a line shown twice or skipped."""
from __future__ import annotations

import os
import sys
import types

import pytest

from launcher.cli import logview
from launcher.cli.logview import View, _Tail


def _write_lines(path, n: int, start: int = 0) -> None:
    """n numbered lines, written a block at a time (fast for tens of MB)."""
    with open(path, "a") as f:
        for lo in range(start, start + n, 10000):
            f.write("".join(f"line {i:09d} some padding text\n" for i in range(lo, min(lo + 10000, start + n))))


@pytest.fixture
def pread_bytes(monkeypatch):
    """The bytes read through os.pread, counted."""
    count = [0]
    real = os.pread

    def counting(fd, n, off):
        data = real(fd, n, off)
        count[0] += len(data)
        return data
    monkeypatch.setattr(os, "pread", counting)
    return count


def _tail(path):
    got: list[list[str]] = []
    return _Tail(str(path), got.append), got


def test_tail_reads_only_the_end_then_follows_new_lines(tmp_path, pread_bytes):
    path = tmp_path / "node0.log"
    n = 1_600_000   # ~50 MB
    _write_lines(path, n)
    assert os.path.getsize(path) > 45 << 20
    t, got = _tail(path)
    t.show(5)
    assert got == [[f"line {i:09d} some padding text" for i in range(n - 5, n)]]
    assert pread_bytes[0] < 1 << 20
    got.clear()
    _write_lines(path, 3, start=n)
    t.show()
    assert got == [[f"line {i:09d} some padding text" for i in range(n, n + 3)]]


def test_tail_keeps_a_partial_last_line_for_the_follower(tmp_path):
    path = tmp_path / "node0.log"
    path.write_text("a\nb\nc\nhalf")
    t, got = _tail(path)
    t.show(2)
    assert got == [["b", "c"]]
    with open(path, "a") as f:
        f.write(" done\nnext\n")
    assert t.read() == "half done\nnext\n"


def test_tail_of_a_short_file_and_tail_zero(tmp_path):
    path = tmp_path / "node0.log"
    path.write_text("a\nb\n")
    t, got = _tail(path)
    t.show(5)
    assert got == [["a", "b"]]
    t, got = _tail(path)
    t.show(0)
    assert got == []
    with open(path, "a") as f:
        f.write("c\n")
    t.show()
    assert got == [["c"]]


def test_full_read_gives_every_line_once_in_bounded_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(logview, "READ_CHUNK", 1 << 20)
    sizes = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, off: sizes.append(n) or real(fd, n, off))
    path = tmp_path / "node0.log"
    n = 150_000   # ~5 MB
    _write_lines(path, n)
    t, got = _tail(path)
    t.show()
    assert len(got) > 1 and max(sizes) <= 1 << 20
    assert [x for chunk in got for x in chunk] == [f"line {i:09d} some padding text" for i in range(n)]


def test_view_tail_keeps_the_node_prefix(tmp_path, capsys):
    path = tmp_path / "node0.log"
    _write_lines(path, 1000)
    attempt = types.SimpleNamespace(n=0, log_paths=[str(path)])
    reg = types.SimpleNamespace(attempts=lambda run_id: [attempt])
    run = types.SimpleNamespace(id="r1", state="done", active=False, hosts=["h0"])
    view = View(reg, run, 0, None)
    view.printer.color = False
    view.printer.out = sys.stdout
    view.show(2)
    out = capsys.readouterr().out
    assert out == "".join(f"[node0 h0] line {i:09d} some padding text\n" for i in (998, 999))

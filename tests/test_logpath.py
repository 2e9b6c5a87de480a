"""The log path under pressure: a flood never holds up a teardown, a slow console skips and
says so, a removed log directory costs one line; the node logs keep every line throughout."""
from __future__ import annotations

import pytest
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .helpers import ROOT, limit, script_job, write_spec
from .procs import job_pids, job_pids_left

# Every test here starts a real torchrun job on this machine.
pytestmark = pytest.mark.launches


RECORD = re.compile(r"(\d{9}) x{1014}(?!x)")   # tests/scripts/flood_then_fail.py, in rank 0's text (flood_lines)
NOT_SHOWN = re.compile(r"^\[mlaunch\] console: [\d.]+ MB of node output not shown "
                       r"here; every line is in (\S+)[;,\n]")


def launch(tmp_path, spec: dict, stdout) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", write_spec(tmp_path, spec)],
                            cwd=ROOT, stdout=stdout, stderr=subprocess.STDOUT)


def flood_lines(path: str) -> list[int]:
    """The sequence numbers of rank 0's whole records in a node log, in order.

    Rank 0's text is what follows each "[default0]:" to the end of its line, searched anywhere
    in a line (torchrun's own stderr, its SIGTERM traceback, shares the node's stream with the
    tail it copies, so a record may follow a fragment of it), and put back together: torchrun's
    tail reads the rank's log file line by line and, when it catches the rank mid-write, prints
    half a line, then the rest as a line of its own (seen in CI: record 91 as "[default0]:000000091
    xxx" + "[default0]:xxx"). Every byte is there; a lost or reordered one is still caught."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    # Up to the next header too: a piece can also end inside a line, the rest behind a second
    # header on the same line (a write the tail caught half-done: CI, record 323).
    stream = "".join(re.findall(r"\[default0\]:(.*?)(?=\[default0\]:|\n|$)", text, re.M))
    return [int(m.group(1)) for m in RECORD.finditer(stream)]


def test_failed_rank_tears_down_a_flooding_job_without_the_backlog(tmp_path):
    """Rank 0 floods; rank 1 fails once 20 MB are written: exit 1, nothing of the run left,
    the node log numbered without a gap, one console line naming it for what was not shown."""
    marker = str(tmp_path / "marker")
    spec = script_job(["localhost", "127.0.0.1"], 1, "flood_then_fail.py", [marker, "20000"],
                      str(tmp_path / "out"), cuda_visible_devices=[[0], [1]])
    spec["name"] = f"flood{os.getpid()}"
    with open(tmp_path / "console", "wb") as out:
        proc = launch(tmp_path, spec, out)
        assert proc.wait() == 1
    assert job_pids_left(spec["name"] + "-", limit(10)) == set(), "processes of the run were left"
    console = (tmp_path / "console").read_text()
    (log,) = glob.glob(str(tmp_path / "out/logs/*/node0-*.log"))
    seqs = flood_lines(log)
    assert seqs == list(range(len(seqs))) and len(seqs) >= 20000
    said = [NOT_SHOWN.match(line + "\n") for line in console.splitlines()]
    assert [m.group(1) for m in said if m] == [log], console[-3000:]


def test_slow_console_skips_to_the_newest_and_says_it_is_behind(tmp_path):
    """A console read slowly: it says it is behind by how many MB, later lines still come,
    the node log holds all 30,000."""
    spec = script_job(["localhost"], 1, "flood_then_fail.py", ["-", "30000"], str(tmp_path / "out"))
    proc = launch(tmp_path, spec, subprocess.PIPE)
    got = bytearray()
    while chunk := proc.stdout.read1(16384):
        got += chunk
        if len(got) < 4 * 2**20:   # a terminal at 16 KB a read, slowed for the first 4 MB
            time.sleep(0.02)  # the reader's pace, not a wait for anything
    assert proc.wait() == 0
    text = got.decode()
    (log,) = glob.glob(str(tmp_path / "out/logs/*/node0-*.log"))
    assert flood_lines(log) == list(range(30000))
    behind = [i for i, line in enumerate(text.splitlines())
              if re.match(r"\[mlaunch\] console behind: skipped [\d.]+ MB to keep up, "
                          r"showing the newest; every line is in " + re.escape(log) + "$", line)]
    assert behind, text[-2000:]
    shown = [int(m.group(1)) for m in re.finditer(r"^\[node0 localhost local0\] (\d{9}) ", text, re.M)]
    assert shown == sorted(shown) and shown[-1] > len(shown), "no gap: nothing was skipped"


def _wait_for_file(path: str, proc: subprocess.Popen, seconds: float) -> None:
    """Until path exists (the event waited on); fails when the run ends first or past limit()."""
    wait = limit(seconds)
    deadline = time.monotonic() + wait
    while not os.path.exists(path):
        assert proc.poll() is None, f"the run ended before {path}"
        assert time.monotonic() < deadline, f"no {path} within {wait:.0f} s"
        time.sleep(0.02)


def _stopped(pid: int) -> bool:
    """pid is stopped by a signal (state T in /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read()
    return stat[stat.rindex(b")") + 2:].split()[0] == b"T"


def test_a_rank_never_waits_for_a_stopped_launcher(tmp_path):
    """mlaunch stopped (SIGSTOP) before the rank writes: the rank still writes all of its
    4 MB (60 times what the pipe between them holds) and says so; once mlaunch continues,
    the run ends 0 with every line in the node log."""
    ready, go, done = (str(tmp_path / name) for name in ("ready", "go", "done"))
    spec = script_job(["localhost"], 1, "write_when_told.py", [ready, go, done, "4000"],
                      str(tmp_path / "out"), hangup_after_s=600)   # no heartbeat while stopped
    with open(tmp_path / "console", "wb") as out:
        proc = launch(tmp_path, spec, out)
        try:
            _wait_for_file(ready, proc, 60)
            proc.send_signal(signal.SIGSTOP)
            # A signal is acted on when its target next runs: on a loaded machine that can be
            # after a 4 MB write is over, so the rank is told to write only once mlaunch is
            # seen stopped (loaded run e failed the check below without this wait).
            deadline = time.monotonic() + limit(30)
            while not _stopped(proc.pid):
                assert time.monotonic() < deadline, "mlaunch did not stop on SIGSTOP"
                time.sleep(0.01)
            open(go, "w").close()
            _wait_for_file(done, proc, 60)
            assert _stopped(proc.pid), "mlaunch ran while the rank wrote"
        finally:
            proc.send_signal(signal.SIGCONT)
        assert proc.wait(timeout=limit(120)) == 0, (tmp_path / "console").read_text()[-3000:]
    (log,) = glob.glob(str(tmp_path / "out/logs/*/node0-*.log"))
    assert flood_lines(log) == list(range(4000))


def _wait_line(proc: subprocess.Popen, text: str) -> list[str]:
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError("".join(seen))


def _damage_log_dir_mid_run(tmp_path, damage, hs=None) -> tuple[str, str]:
    """Run a job that waits for a file (on this machine, or on the hosts of HostSet hs: their
    node logs spliced, session/nodeoutput.py); once it runs, remove its log directory and call
    damage(log_dir), then release it. (console output, log_dir); the run ended 0, no traceback."""
    go = str(tmp_path / "go")
    hosts = [h.ip for h in hs.hosts] if hs else ["localhost"]
    spec = script_job(hosts, 1, "wait_for_file.py", [go], str(tmp_path / "out"), hs=hs)
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", write_spec(tmp_path, spec)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = _wait_line(proc, "waiting for")
    (log_dir,) = glob.glob(str(tmp_path / "out/logs/*"))
    _take_away(log_dir)
    damage(log_dir)
    open(go, "w").close()
    out = "".join(seen) + proc.stdout.read()
    assert proc.wait() == 0, out
    # mlaunch's own lines: a node's may hold torchrun's (loaded, run 33: node 1's agent reached
    # its exit barrier after node 0's, which hosts the store, had left, and logged the error;
    # the job still exited 0)
    assert not [ln for ln in out.splitlines() if "Traceback" in ln and not ln.startswith("[node")], out
    return out, log_dir


def _take_away(path: str) -> None:
    """Remove a directory the run writes into, at once: renamed aside, then deleted. An rmtree
    in place raced the run's live view (live.json, rewritten each second): a file made between
    its listing and its rmdir failed it (loaded run 5, "Directory not empty")."""
    aside = tempfile.mkdtemp(dir=os.path.dirname(path), prefix=".gone-")
    os.rename(path, os.path.join(aside, "d"))
    shutil.rmtree(aside)


def _replace_with_file(path: str) -> None:
    """A plain file where the (taken away) directory was; if the run made the directory again
    meanwhile, it is taken away again first."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".file-")
    os.close(fd)
    while True:
        try:
            os.rename(tmp, path)
            return
        except IsADirectoryError:
            _take_away(path)


def test_log_dir_removed_mid_run_costs_one_line_not_the_run(tmp_path):
    """The run's log directory removed while it runs: made again, one line, exit 0."""
    out, log_dir = _damage_log_dir_mid_run(tmp_path, lambda log_dir: None)
    assert out.count(f"{log_dir} was removed during the run") == 1, out
    assert os.path.exists(os.path.join(log_dir, "events.jsonl"))
    assert "released" in open(glob.glob(os.path.join(log_dir, "node0-*.log"))[0]).read()


def test_log_dir_that_cannot_be_written_costs_one_line_not_the_run(tmp_path):
    """The log directory replaced by a plain file (no event can be written): one line, exit 0."""
    out, log_dir = _damage_log_dir_mid_run(tmp_path, _replace_with_file)
    assert out.count(f"cannot record events in {log_dir}/events.jsonl") == 1, out


@pytest.mark.multihost
def test_log_dir_removed_mid_run_over_ssh_costs_one_line_and_the_logs_go_on(hosts2, tmp_path):
    """As above, with the node logs written by splice(2) from the relay: made again, one line,
    exit 0, the lines after the removal in the new node logs."""
    out, log_dir = _damage_log_dir_mid_run(tmp_path, lambda log_dir: None, hs=hosts2)
    assert out.count(f"{log_dir} was removed during the run") == 1, out
    logs = glob.glob(os.path.join(log_dir, "node*.log"))
    assert len(logs) == 2 and all("released" in open(p).read() for p in logs), out


@pytest.mark.multihost
def test_log_dir_that_cannot_be_written_over_ssh_costs_one_line_per_file(hosts2, tmp_path):
    """The log directory replaced by a plain file under spliced node logs: the events' one
    line, each node log's one line, the nodes' later output on the console, exit 0."""
    out, log_dir = _damage_log_dir_mid_run(tmp_path, _replace_with_file, hs=hosts2)
    assert out.count(f"cannot record events in {log_dir}/events.jsonl") == 1, out
    assert out.count("that node's output from here on is only on the console") == 2, out
    assert out.count("released") >= 2, out

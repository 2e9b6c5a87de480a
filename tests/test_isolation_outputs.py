"""What another user can leave in a shared output_dir: a newer checkpoint-N of their own, a
trainer_state.json or run lock that is a link to /dev/zero or a FIFO, a lock whose fields hold
escape sequences. The node programs run as they are shipped (their text on stdin): none is
resumed from, none hangs or reads without bound, and the error line shows only printable text.
Checkpoints are owned by another uid through chown, so those tests need root."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from launcher.nodeprog import source
from launcher.nodeprog.checkpoints import find_latest_complete
from launcher.runs.outputdir import _said

from .loadfactor import limit
from .test_checkpoints import make_ckpt

OTHER = 4321   # a uid that is neither the test's user nor output_dir's owner
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def ship(program: str, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-", *args], input=source(program), capture_output=True,
                       text=True, timeout=limit(60), cwd="/")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _chown_tree(path, uid: int) -> None:
    for d, dirs, files in os.walk(path):
        for name in [d, *(os.path.join(d, n) for n in dirs + files)]:
            os.chown(name, uid, uid)


@root_only
def test_another_users_newer_checkpoint_is_skipped_and_the_own_one_used(tmp_path):
    out = tmp_path / "out"
    mine = make_ckpt(out, "checkpoint-10")
    _chown_tree(make_ckpt(out, "checkpoint-999"), OTHER)
    got = ship("checkpoints", str(out))
    assert got["latest"] == str(mine) and got["step"] == 10, got
    assert [s["name"] for s in got["skipped"]] == ["checkpoint-999"]
    assert got["skipped"][0]["reason"].startswith(f"owned by uid {OTHER}, neither you, root nor output_dir's owner")
    # A swift version dir of another user hides its checkpoints as well
    version = out / "v1-20260101-000000"
    make_ckpt(version, "checkpoint-500")
    os.chown(version, OTHER, OTHER)
    got = ship("checkpoints", str(out))
    assert got["latest"] == str(mine) and "owned by uid" in got["skipped"][0]["reason"], got


@root_only
def test_the_output_dirs_owner_counts_as_own(tmp_path):
    """A team's output_dir belongs to its lead: the lead's checkpoints are the run's own."""
    out = tmp_path / "out"
    newest = make_ckpt(out, "checkpoint-20")
    _chown_tree(out, OTHER)
    d = find_latest_complete(str(out))
    assert d.latest == str(newest) and d.skipped == ()


@pytest.mark.parametrize("kind", ["link to /dev/zero", "fifo"])
def test_a_trainer_state_that_is_no_regular_file_is_skipped_without_hanging(tmp_path, kind):
    """--resume=PATH's check of a folder not named checkpoint-N reads its step from
    trainer_state.json: the old reading blocked on the FIFO or read /dev/zero on. (The scan
    looked for a regular file before reading, then and now.)"""
    out = tmp_path / "out"
    mine = make_ckpt(out, "checkpoint-10")
    planted = make_ckpt(out, "checkpoint-20", state=False)
    named = make_ckpt(out, "best", state=False)
    for d in (planted, named):
        os.mkfifo(d / "trainer_state.json") if kind == "fifo" else os.symlink("/dev/zero", d / "trainer_state.json")
    got = ship("checkpoints", str(out))
    assert got["latest"] == str(mine), got
    assert got["skipped"][0]["reason"] == "no trainer_state.json (interrupted save?)", got
    got = ship("checkpoints", str(out), "--checkpoint", str(named))
    assert got["latest"] is None and got["skipped"][0]["reason"] == (
        "not a checkpoint-N directory and no trainer_state.json with a global_step"), got


def test_an_oversized_trainer_state_is_refused_unread(tmp_path):
    out = tmp_path / "out"
    mine = make_ckpt(out, "checkpoint-10")
    big = make_ckpt(out, "checkpoint-20", state=False) / "trainer_state.json"
    with open(big, "wb") as fh:
        fh.truncate(80 << 30)   # 80 GB, sparse: costs nothing on disk
    got = ship("checkpoints", str(out))
    assert got["latest"] == str(mine)
    assert "over the 1073741824 read here" in got["skipped"][0]["reason"], got


@pytest.mark.parametrize("kind", ["link to /dev/zero", "fifo"])
def test_a_planted_run_lock_is_taken_over_unread_and_kept_as_evidence(tmp_path, kind):
    out = tmp_path / "out"
    out.mkdir()
    lock = out / ".mlaunch.lock"
    os.mkfifo(lock) if kind == "fifo" else os.symlink("/dev/zero", lock)
    got = ship("outdir", "lock", str(out), "here", str(os.getpid()), "run-a")
    assert got["ok"] is True and got["took_over"] is True and got["why"] == "unreadable lock", got
    assert json.loads(lock.read_text())["run_id"] == "run-a"
    stale = out / ".mlaunch.lock.stale"   # the planted thing itself, moved aside, never followed
    assert (os.readlink(stale) == "/dev/zero") if kind != "fifo" else os.path.exists(stale)


def test_a_lock_holders_fields_reach_the_terminal_printable_and_short():
    assert _said("run-1") == "run-1" and _said(4242) == "4242"
    assert _said("\x1b[2J\x1b]0;owned\x07host") == "\\x1b[2J\\x1b]0;owned\\x07host"
    long = _said("h" * 5000)
    assert len(long) == 83 and long.endswith("...")


def _reported_run(tmp_path):
    """A finished run's files as `mlaunch report` reads them: output_dir/trainer_log.jsonl,
    output_dir/logs/<id>/node0-<host>.log and its events.jsonl."""
    out = tmp_path / "out"
    (out / "logs" / "run-r").mkdir(parents=True)
    (out / "logs" / "run-r" / "node0-127.0.0.1.log").write_text("[node0] training\n")
    recs = [{"current_steps": s, "total_steps": 6, "loss": 2.0 - s / 10, "lr": 1e-3,
             "elapsed_time": f"0:00:0{s}"} for s in range(1, 7)]
    (out / "trainer_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    events = [{"time": "2026-12-01T09:00:00.000Z", "run_id": "run-r", "attempt": 0, "event": "run_start"},
              {"time": "2026-12-01T09:00:05.000Z", "run_id": "run-r", "attempt": 0, "event": "first_step"}]
    (out / "logs" / "run-r" / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return str(out / "logs" / "run-r")


def test_report_writes_no_file_through_a_planted_link_and_keeps_its_files_private(tmp_path):
    pytest.importorskip("matplotlib")
    from .helpers import mlaunch
    run, rep = _reported_run(tmp_path), tmp_path / "rep"
    rep.mkdir()
    victim = tmp_path / "bashrc"
    victim.write_text("# mine\n")
    os.symlink(victim, rep / "report.md")
    os.chmod(rep, 0o1777)   # as /tmp is: another user could have planted the link
    r = mlaunch("report", run, "--report-dir", str(rep))
    assert r.returncode == 2 and victim.read_text() == "# mine\n", r.stdout + r.stderr
    assert f"{rep}/report.md: a link (to {victim})" in r.stderr and "Traceback" not in r.stderr
    assert sorted(os.listdir(rep)) == ["report.md"]   # nothing written before the refusal
    os.remove(rep / "report.md")
    r = mlaunch("report", run, "--report-dir", str(rep))
    assert r.returncode == 0, r.stderr
    modes = {n: os.stat(rep / n).st_mode & 0o777 for n in os.listdir(rep)}
    assert modes == {"report.md": 0o600, "report.png": 0o600, "series.json": 0o600}
    assert (rep / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [s for s, _ in json.loads((rep / "series.json").read_text())["runs"][0]["loss"]] == list(range(1, 7))


def test_a_report_reads_past_what_another_run_of_the_output_dir_planted(tmp_path):
    """Other users' runs in a shared output_dir's logs/: a line with `"attempt": [1]` made every
    report of that output_dir fail (TypeError), and so did a time without a zone in year 1."""
    pytest.importorskip("matplotlib")
    from .helpers import mlaunch
    run = _reported_run(tmp_path)
    other = os.path.join(os.path.dirname(run), "run-planted")
    os.makedirs(other)
    with open(os.path.join(other, "events.jsonl"), "w") as fh:
        for e in ({"event": "first_step", "attempt": [1], "time": "2026-12-01T09:00:00Z"},
                  {"event": "run_start", "attempt": True, "resume_from": "/o/checkpoint-²"},
                  {"event": ["x"], "time": "2026-12-01T09:00:00Z"},
                  {"event": "restart", "attempt": 1, "resume_from": "/o/checkpoint-²"}):
            fh.write(json.dumps(e) + "\n")
    r = mlaunch("report", run, "--report-dir", str(tmp_path / "rep"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    steps = json.loads((tmp_path / "rep" / "series.json").read_text())["runs"][0]["loss"]
    assert [s for s, _ in steps] == list(range(1, 7))
    with open(os.path.join(other, "events.jsonl"), "a") as fh:   # a well-formed launch, no zone, year 1:
        fh.write(json.dumps({"event": "first_step", "attempt": 0, "time": "0001-01-01T00:00:00"}) + "\n")
    r = mlaunch("report", run, "--report-dir", str(tmp_path / "rep"))   # it may claim steps; never a crash
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]


def test_an_events_file_that_is_a_fifo_reads_as_none_without_hanging(tmp_path):
    os.mkfifo(tmp_path / "events.jsonl")
    code = f"from launcher.record import runevents; print(runevents.read({str(tmp_path)!r}))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=limit(60))
    assert r.returncode == 0 and r.stdout == "[]\n", r.stderr

"""Issue 51, items 3, 6 and 11 (the registry and run-id parts): run ids matched whole and never
a restart tag, a full MLAUNCH_HOME that never changes how a finished run is recorded, exact
RUN matching, a damaged page, a taken id, the registry directory's owner and mode, and
mlaunch's own node variables refused in cluster.env."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from launcher.record.events import read_events
from launcher.record.registry import Registry

from .helpers import script_job, write_spec
from .loadfactor import limit
from .runs import Runs
from .users import other_user


@pytest.fixture
def runs(tmp_path) -> Runs:
    return Runs(str(tmp_path / "home"))


def _one_line(r, text: str) -> None:
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr == f"mlaunch: {text}\n", r.stderr


def _register(home: str, run_id: str, spec: dict, name: str = "job") -> None:
    """A run row as any mlaunch (an older one included) left it: supervisor gone."""
    reg = Registry(os.path.join(home, "runs.db"))
    try:
        reg.create(run_id, name=name, backend="local", hosts=["localhost"], spec=spec,
                   detached=True, supervisor=(0, None), log_dir="/nonexistent", output_dir=None)
    finally:
        reg.close()


def _tagged_sleeper(run_id: str) -> subprocess.Popen:
    """A process carrying MLAUNCH_RUN_ID=<run_id>, as a rank of that run would."""
    return subprocess.Popen(["sleep", "600"], env={**os.environ, "MLAUNCH_RUN_ID": run_id},
                            start_new_session=True)


def _gone(proc: subprocess.Popen) -> bool:
    try:
        proc.wait(timeout=limit(30))
        return True
    except subprocess.TimeoutExpired:
        return False


@pytest.mark.launches
def test_item3_a_run_id_is_matched_whole_and_never_a_restart_tag(tmp_path, runs):
    """`x\\n` (a trailing newline split the teardown) and `X.a1` (run X's attempt-1 tag) are
    refused before anything is written; `stop X` beside an `X.a1` an older mlaunch accepted
    ends X's processes and never X.a1's."""
    spec = script_job(["localhost"], 1, "fail_or_sleep.py", ["0", "0", "0"], str(tmp_path / "out"))
    path = write_spec(tmp_path, spec)
    r = runs.cli("submit", path, "--run-id", "x\n", "--no-preflight")
    _one_line(r, "--run-id 'x\\n': a run id is 1-128 letters, digits, '.', '_' or '-', starting "
                 "with a letter or digit (no '/', no '..'); give such an id, or leave --run-id "
                 "out for a fresh one")
    for args in (["submit", path, "--no-preflight"], ["submit", path, "--dry-run"]):
        r = runs.cli(*args, "--run-id", "X.a1")
        _one_line(r, "--run-id 'X.a1': ends like a restart tag (.a<N>), which names attempt N of "
                     "run 'X': stopping that run would end this one's processes too; give an id "
                     "without it, or leave --run-id out")
    assert not os.path.exists(runs.home) and not (tmp_path / "out").exists()

    for run_id in ("X", "X.a1"):   # both registered, as an older mlaunch allowed
        _register(runs.home, run_id, spec)
    victim, bystander = _tagged_sleeper("X"), _tagged_sleeper("X.a1")
    try:
        s = runs.cli("stop", "X")
        assert s.returncode == 0, s.stdout + s.stderr
        assert _gone(victim), "run X's process survived `stop X`"
        assert bystander.poll() is None, "`stop X` ended run X.a1's process"
        s = runs.cli("stop", "X.a1")   # the older run itself is still stoppable
        assert s.returncode == 0, s.stdout + s.stderr
        assert _gone(bystander)
    finally:
        for p in (victim, bystander):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _mount_tmpfs(where: str, size: str) -> None:
    os.makedirs(where)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", where],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs as MLAUNCH_HOME here: {r.stderr.strip()}")


def _fill(folder: str) -> None:
    subprocess.run(["dd", "if=/dev/zero", f"of={folder}/filler", "bs=64k"], capture_output=True)
    assert os.statvfs(folder).f_bavail == 0


def _wait_for(cond, what: str, timeout: float = 120):
    deadline = time.monotonic() + limit(timeout)
    while not (got := cond()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return got


@pytest.mark.launches
@pytest.mark.parametrize("detach", [False, True])
def test_item6_a_full_registry_disk_keeps_a_finished_runs_exit(tmp_path, detach):
    """MLAUNCH_HOME (a 2 MB tmpfs) fills up while the trainer runs; it then exits 0. The run
    keeps exit 0 and its run_end, the foreground says in one line per failed record where it
    could not go and why (no traceback), and once there is room `ps` shows it succeeded."""
    home, go = str(tmp_path / "home"), str(tmp_path / "go")
    _mount_tmpfs(home, "2m")
    runs = Runs(home)
    try:
        spec = script_job(["localhost"], 1, "wait_for_file.py", [go], str(tmp_path / "out"))
        args = ["submit", *(["-d"] if detach else []), write_spec(tmp_path, spec),
                "--no-preflight", "--run-id", "full1"]
        sub = runs.popen(*args)
        _wait_for(lambda: "waiting for" in (open(runs.console_path("full1")).read()
                  if os.path.exists(runs.console_path("full1")) else ""), "never started")
        if detach:
            out, err = sub.communicate(timeout=limit(60))
            assert sub.returncode == 0, out + err
        _fill(home)
        open(go, "w").close()
        events = os.path.join(tmp_path, "out", "logs", "full1", "events.jsonl")
        if not detach:
            out, err = sub.communicate(timeout=limit(120))
            assert sub.returncode == 0, out[-2000:] + err
            assert "Traceback" not in err and "Traceback" not in out, err
            db = os.path.join(home, "runs.db")
            assert err.splitlines()[-1] == (
                f"mlaunch: run full1 succeeded (exit 0), not recorded in {db} (database or disk "
                f"is full); `mlaunch ps` reads its end from {events}"), err
            assert all(line.startswith("mlaunch: ") for line in err.splitlines()), err
        _wait_for(lambda: [e["code"] for e in read_events(events) if e["event"] == "run_end"],
                  "no run_end")
        assert [e["code"] for e in read_events(events) if e["event"] == "run_end"] == [0]
        if detach:   # the supervisor ended on its own, without a traceback
            _wait_for(lambda: runs_gone("full1"), "the supervisor never ended")
        os.remove(os.path.join(home, "filler"))
        row = runs.run("full1")
        assert (row["state"], row["exit_code"]) == ("succeeded", 0), row
    finally:
        subprocess.run(["umount", "-l", home], capture_output=True)


def runs_gone(run_id: str) -> bool:
    """No supervisor of run_id left (its command line names the run id)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if b"launcher.backends.supervisor" in argv and run_id.encode() in argv:
            return False
    return True


def _damage_one_page(db: str) -> None:
    """One page past the schema's, all of it garbage: the listing query may skip it."""
    with open(db, "r+b") as fh:
        fh.seek(2 * 4096)
        fh.write(b"\xa5" * 4096)


def test_item11_run_matching_taken_ids_damage_home_mode_and_owned_env(tmp_path, runs):
    """RUN matches case-sensitively; a damaged page, a taken --run-id, another user's
    MLAUNCH_HOME and cluster.env.MLAUNCH_RUN_ID are one line and exit 2; a 0755 home of
    this user's becomes 0700."""
    spec = script_job(["localhost"], 1, "fail_or_sleep.py", ["0", "0", "0"], str(tmp_path / "out"))
    _register(runs.home, "lk1", spec, name="lowjob")
    for cmd in ("ps", "stop", "logs"):
        _one_line(runs.cli(cmd, "LK1"), "RUN 'LK1': no run with this id prefix or job name; see "
                                        "`mlaunch ps --all`")
    assert runs.run("lk1")["stop_requested"] is False

    # A taken id: one line naming it, and the earlier run untouched.
    before = runs.run("lk1")
    r = runs.cli("submit", write_spec(tmp_path, spec), "--run-id", "lk1", "--no-preflight")
    _one_line(r, "--run-id 'lk1': taken by an earlier run (job lowjob, lost) in this registry; "
                 "pick another id, or leave --run-id out for a fresh one")
    assert runs.run("lk1") == before

    # mlaunch's own node variables: refused, never noted and dropped.
    r = runs.cli("validate", write_spec(tmp_path, spec), "cluster.env.MLAUNCH_RUN_ID=evil")
    assert r.returncode == 2, r.stdout + r.stderr
    assert ("cluster.env.MLAUNCH_RUN_ID: mlaunch's own: it sets it on every node to find and "
            "tear down the run's processes; remove it (--run-id names the run) (set by the "
            "override cluster.env.MLAUNCH_RUN_ID=evil)") in r.stderr and "note:" not in r.stdout

    # A 0755 home of this user's is made 0700; another user's is refused.
    os.chmod(runs.home, 0o755)
    assert runs.ps() and stat.S_IMODE(os.stat(runs.home).st_mode) == 0o700
    other = other_user()
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, other.uid, other.gid)
    _one_line(Runs(str(theirs)).cli("ps"),
              f"run registry {theirs}/runs.db: its directory {theirs} belongs to {other.name}, "
              "not to you: whoever else can write there can read, swap or remove your runs; "
              "set MLAUNCH_HOME to a directory of your own")
    assert os.listdir(theirs) == []

    # A damaged page that the listing would skip: one line, exit 2, for every run command.
    for i in range(40):
        _register(runs.home, f"pad-{i:03d}", {**spec, "pad": "x" * 500})
    db = os.path.join(runs.home, "runs.db")
    Registry(db).close()
    _damage_one_page(db)
    reg = Registry(db)   # the listing's own query reads past the damage: `ps` said nothing
    assert len(reg.runs(include_final=False)) == 41
    reg.close()
    for args in (["ps"], ["ps", "--all", "--json"], ["stop", "lk1"]):
        r = runs.cli(*args)
        _one_line(r, f"run registry {db}: damaged (database disk image is malformed: Page 3: "
                     f"btreeInitPage() returns error code 11); move it aside (mv {db} "
                     f"{db}.damaged) and recover what you can with `sqlite3 {db}.damaged "
                     ".recover`, or set MLAUNCH_HOME to another directory")

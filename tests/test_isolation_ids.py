"""Issue 51, items 3, 6 and 11 (the registry and run-id parts): run ids matched whole (run
X.a1 is never run X's attempt), a full MLAUNCH_HOME that never changes how a finished run is
recorded, exact RUN matching, a damaged page, a taken id, the registry directory's owner and
mode, and mlaunch's own node variables refused in cluster.env."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import time

import pytest

from launcher.record.events import read_events
from launcher.backends.base import proc_start
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


def _tagged(tag: str) -> dict[int, bytes]:
    """{pid: command line} of this machine's live processes whose MLAUNCH_RUN_ID is exactly
    tag (a whole-value match: tests/procs.py's job_pids matches a prefix, and X is a prefix
    of X.a1)."""
    needle = f"MLAUNCH_RUN_ID={tag}".encode()
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        if _alive(int(pid)):
            out[int(pid)] = cmdline
    return out


def _alive(pid: int) -> bool:
    """pid is a process that has not ended (a zombie not yet reaped has ended)."""
    return proc_start(pid) is not None


def _node_pids(runs: Runs, run_id: str) -> set[int]:
    """The processes of a detached run whose 2 ranks said `ready` that live until torn down:
    its node leader (torchrun: the pid in the pidfile its recorded plan names) and its 2 ranks,
    each tagged with its run id. (The node's short-lived helpers, a heartbeat's `head -c 1`, the
    live-view sampler, which on a node without GPUs asks the relay for CPU samples and ends,
    carry the tag too, and end on their own.)"""
    runs.wait_console(run_id, r"ready rank \d", count=2)
    reg = Registry(os.path.join(runs.home, "runs.db"))
    try:
        (node,) = reg.get(run_id).plan["nodes"]
    finally:
        reg.close()
    with open(node["pidfile"]) as fh:
        leader = int(fh.read().split()[0])
    tagged = _tagged(run_id)
    ranks = {pid for pid, cmd in tagged.items() if b"fail_or_sleep.py" in cmd and pid != leader}
    assert leader in tagged and len(ranks) == 2, (leader, tagged)
    return {leader} | ranks


@pytest.mark.launches
def test_item3_run_X_a1_is_a_run_of_its_own_that_stop_X_never_reaches(tmp_path, runs):
    """`x\\n` (a trailing newline split the teardown) is refused before anything is written.
    `X.a1` is a run id like any other (attempt 1 of X is tagged `X+a1`): runs X and X.a1,
    detached side by side on localhost; `stop X` ends every process of X (by PID) and none
    of X.a1's; `stop X.a1` then ends those."""
    out = str(tmp_path / "out")
    spec = script_job(["localhost"], 1, "fail_or_sleep.py", ["0", "0", "0"], out)
    r = runs.cli("submit", write_spec(tmp_path, spec), "--run-id", "x\n", "--no-preflight")
    _one_line(r, "--run-id 'x\\n': a run id is 1-128 letters, digits, '.', '_' or '-', starting "
                 "with a letter or digit (no '/', no '..'); give such an id, or leave --run-id "
                 "out for a fresh one")
    assert not os.path.exists(runs.home) and not os.path.exists(out)

    # 2 ranks each (torchrun, a master port and an output_dir of its own), sleeping until torn
    # down; the run dirs (and pidfiles) under this test's own shared_dir.
    (tmp_path / "shared").mkdir()
    pids: dict[str, set[int]] = {}
    try:
        for run_id in ("X", "X.a1"):
            spec = script_job(["localhost"], 2, "fail_or_sleep.py", ["-1", "0", "0"],
                              str(tmp_path / f"out-{run_id}"), shared_dir=str(tmp_path / "shared"))
            r = runs.cli("submit", "--detach", write_spec(tmp_path, spec, f"{run_id}.yaml"),
                         "--no-preflight", "--run-id", run_id)
            assert r.returncode == 0, r.stdout + r.stderr
            assert f"run {run_id} detached" in r.stdout, r.stdout
            pids[run_id] = set()   # stopped below, whatever fails
            pids[run_id] = _node_pids(runs, run_id)
        assert not pids["X"] & pids["X.a1"]

        s = runs.cli("stop", "X")
        assert s.returncode == 0, s.stdout + s.stderr
        _wait_for(lambda: not [p for p in pids["X"] if _alive(p)],
                  "run X's processes survived `stop X`")
        assert [p for p in pids["X.a1"] if not _alive(p)] == [], "`stop X` ended run X.a1's processes"
        assert runs.run("X")["state"] == "stopped" and runs.run("X.a1")["state"] == "running"

        s = runs.cli("stop", "X.a1")
        assert s.returncode == 0, s.stdout + s.stderr
        _wait_for(lambda: not [p for p in pids["X.a1"] if _alive(p)], "`stop X.a1` left processes")
        assert runs.run("X.a1")["state"] == "stopped"
    finally:   # nothing of either run outlives the test (both ids are this machine's tags)
        for run_id in pids:
            if runs.run(run_id)["state"] in ("starting", "running", "restarting"):
                runs.cli("stop", run_id)
        for pid in set().union(*pids.values()):
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


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

"""Issue 51, items 1, 2 and 9: no other user steers a run's files through a link or a folder
they planted. The attacker is a second real Unix user (tests/users.py) who can write a team's
output_dir or workdir; the victim is root running mlaunch. Each refusal is one line, exit 2,
nothing started, and the link's target keeps its content and mode."""
from __future__ import annotations

import os
import stat
import subprocess
import tempfile

import pytest

from launcher import render
from .helpers import mlaunch, script_job, write_spec
from .users import other_user

SECRET = "root's own file\n"


def _mode(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def team(tmp_path):
    """(the other user, a 0777 team folder under /tmp, root's 0644 file and 0755 folder that
    a planted link points to). Not sticky: fs.protected_symlinks does not guard it."""
    user = other_user()
    d = tempfile.mkdtemp(prefix="mlaunch-i51-", dir="/tmp")
    os.chmod(d, 0o777)
    target_file, target_dir = os.path.join(d, "victim.txt"), os.path.join(d, "victim-dir")
    with open(target_file, "w") as fh:
        fh.write(SECRET)
    os.chmod(target_file, 0o644)
    os.mkdir(target_dir, 0o755)
    os.chmod(target_dir, 0o755)
    yield user, d, target_file, target_dir
    subprocess.run(["rm", "-rf", "--", d], check=False)


def _untouched(target_file: str, target_dir: str) -> None:
    with open(target_file) as fh:
        assert fh.read() == SECRET
    assert (_mode(target_file), os.stat(target_file).st_uid) == (0o644, 0)
    assert (_mode(target_dir), os.listdir(target_dir)) == (0o755, [])


def _job(d: str, **cluster) -> str:
    """A one-rank local job whose rank prints `ready rank 0` (proof that it started), then exits 0."""
    out = os.path.join(d, "out")
    spec = script_job(["localhost"], 1, "fail_or_sleep.py", ["0", "0", "0"], out, **cluster)
    return write_spec(d, spec)


def _submit(d: str, spec: str, *extra: str):
    return mlaunch("submit", spec, "--no-preflight", *extra, env={"MLAUNCH_HOME": os.path.join(d, "home")})


@pytest.mark.launches
@pytest.mark.parametrize("plant", ["file-link", "dir-link", "other-users-dir"])
def test_item1_launcher_log_dir_through_a_planted_link_is_refused(team, plant):
    """A team output_dir: the other user plants logs/<id>/node0-localhost.log -> root's file,
    logs/<id> -> root's folder, or logs/<id> as their own folder. root's run with that id
    refuses in one line, exit 2, before any node starts; nothing is written through."""
    user, d, target_file, target_dir = team
    spec = _job(d)
    logs = os.path.join(d, "out", "logs")
    os.makedirs(logs)
    os.chmod(os.path.join(d, "out"), 0o777)
    os.chmod(logs, 0o777)
    run_dir = os.path.join(logs, "r51")
    if plant == "dir-link":
        user.plant(run_dir, link_to=target_dir)
        line = f"mlaunch: {run_dir}: a link (to {target_dir}), not a file or directory of root (uid 0)'s"
    else:
        user.plant(run_dir, mode=0o777)
        line = f"mlaunch: {run_dir}: belongs to {user.name} (uid {user.uid}), not to root (uid 0)"
        if plant == "file-link":
            user.plant(os.path.join(run_dir, "node0-localhost.log"), link_to=target_file)
    r = _submit(d, spec, "--run-id", "r51")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.splitlines() == [line + "; mlaunch writes nothing there: remove it (as its owner), "
                                             "or choose a directory of your own"], r.stderr
    assert "ready rank" not in r.stdout + r.stderr   # no rank started
    _untouched(target_file, target_dir)
    if plant != "dir-link":
        assert (os.stat(run_dir).st_uid, _mode(run_dir)) == (user.uid, 0o777)


@pytest.mark.parametrize("plant", ["out-is-a-link", "file-link-in-out"])
def test_item1_render_out_writes_nothing_through_a_planted_link(team, plant):
    """`render --out DIR` in a team folder: DIR planted as a link to root's folder, or
    node0.sh in DIR planted as a link to root's file, is refused before any file is written."""
    user, d, target_file, target_dir = team
    spec = _job(d)
    out = os.path.join(d, "render")
    if plant == "out-is-a-link":
        user.plant(out, link_to=target_dir)
        line = f"{out}: a link to {target_dir} made by {user.name} (uid {user.uid})"
    else:
        os.mkdir(out)
        os.chmod(out, 0o777)
        planted = user.plant(os.path.join(out, "node0.sh"), link_to=target_file)
        line = f"{planted}: a link (to {target_file}), not a file or directory of root (uid 0)'s"
    r = mlaunch("render", spec, "--out", out, "--run-id", "r51")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.splitlines() == [f"mlaunch: {line}; mlaunch writes nothing there: remove it "
                                     "(as its owner), or choose a directory of your own"], r.stderr
    _untouched(target_file, target_dir)
    if plant == "file-link-in-out":
        assert os.listdir(out) == ["node0.sh"] and os.path.islink(os.path.join(out, "node0.sh"))


@pytest.mark.launches
@pytest.mark.parametrize("planted", [".mlaunch", ".mlaunch/root"])
def test_item2_node_run_dir_through_a_planted_link_is_refused(team, planted):
    """A team workdir: the other user plants <workdir>/.mlaunch or .mlaunch/root as a link to
    root's folder. root's node refuses it in one line (exit 2, nothing started); the target
    keeps its mode (no chmod through the link) and gets nothing."""
    user, d, target_file, target_dir = team
    work = os.path.join(d, "work")
    os.mkdir(work)
    os.chmod(work, 0o777)
    if planted == ".mlaunch/root":
        user.plant(os.path.join(work, ".mlaunch"), mode=0o777)
    user.plant(os.path.join(work, planted), link_to=target_dir)
    r = _submit(d, _job(d, workdir=work))
    assert r.returncode == 2, r.stdout + r.stderr
    path = os.path.join(work, planted)
    tail = ("not a directory of root's; remove it, or set cluster.workdir to a directory of yours"
            if planted.endswith("root") else "remove it, or set cluster.workdir to another directory")
    assert f"mlaunch: localhost: {path} on " in r.stderr and (
        f"is a link (to {target_dir}); " if planted == ".mlaunch" else f"is a link (to {target_dir}), ") in r.stderr
    assert tail + "; nothing was started" in r.stderr, r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.startswith("mlaunch:")]) == 1, r.stderr
    assert "ready rank" not in r.stdout + r.stderr
    _untouched(target_file, target_dir)


def test_item2_default_base_through_a_link_is_not_chmodded(team):
    """The default node run dir (/tmp/mlaunch-<user>, here under the team folder so the test
    plants nothing in the real /tmp): the other user's link there is refused by the script
    every node runs, exit 96 and one line, and its target stays 0755 and empty."""
    user, d, target_file, target_dir = team
    base = user.plant(os.path.join(d, "mlaunch-root"), link_to=target_dir)
    script = render.private_dirs_script(os.path.join(base, ".mlaunch", "r51"), default_base=True)
    r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 96
    assert r.stderr.splitlines() == [
        f"mlaunch: {base} on {os.uname().nodename} is a link (to {target_dir}), not a directory of "
        "root's; remove it, or set cluster.workdir to a directory of yours"], r.stderr
    _untouched(target_file, target_dir)


@pytest.mark.launches
def test_item9_a_shared_workdir_serves_every_user(team):
    """A team workdir (1777 like /mnt/shared/work): the other user's `mkdir .mlaunch` (0755,
    theirs) neither blocks nor steers root's run, which gets .mlaunch/root, its own and 0700;
    and in a .mlaunch root made, the other user's node makes .mlaunch/<them>, theirs and 0700,
    while root's stays root's."""
    user, d, _, _ = team
    shared = os.path.join(d, "work")
    os.mkdir(shared)
    os.chmod(shared, 0o1777)
    user.plant(os.path.join(shared, ".mlaunch"), mode=0o755)
    r = _submit(d, _job(d, workdir=shared), "--run-id", "r51")
    assert r.returncode == 0, r.stdout + r.stderr
    mine = os.path.join(shared, ".mlaunch", "root")
    assert (os.lstat(mine).st_uid, _mode(mine), _mode(os.path.join(mine, "r51"))) == (0, 0o700, 0o700)
    assert (os.stat(os.path.join(shared, ".mlaunch")).st_uid, _mode(os.path.join(shared, ".mlaunch"))) == (user.uid, 0o755)

    team_dir = os.path.join(d, "work2")   # root's run first: .mlaunch is made 1777 and sticky
    os.mkdir(team_dir)
    os.chmod(team_dir, 0o1777)
    r = _submit(d, _job(d, workdir=team_dir), "--run-id", "r52")
    assert r.returncode == 0, r.stdout + r.stderr
    top = os.path.join(team_dir, ".mlaunch")
    assert (os.stat(top).st_uid, _mode(top)) == (0, 0o1777)
    theirs = os.path.join(top, user.name, "r53")
    u = user.run(["sh", "-c", render.private_dirs_script(theirs, default_base=False)], timeout=60)
    assert u.returncode == 0, u.stderr
    assert [(os.lstat(p).st_uid, _mode(p)) for p in (os.path.dirname(theirs), theirs)] == [(user.uid, 0o700)] * 2
    assert (os.lstat(os.path.join(top, "root")).st_uid, _mode(os.path.join(top, "root"))) == (0, 0o700)


def test_item9_slurm_shared_dir_team_folder_is_sticky_and_a_link_refused(tmp_path):
    """Launcher-side, under Slurm (shared_dir): the first user's run makes <shared>/.mlaunch
    1777 with the sticky bit and its own <user>/ 0700 inside, so a second user's run finds a
    folder it may use; another user's .mlaunch is used as it is; a .mlaunch that is a link is
    refused (UnsafePath: one line)."""
    import stat as st
    from launcher.record import fsmode
    shared = tmp_path / "shared"
    shared.mkdir()
    mine = fsmode.user_dir(str(shared / ".mlaunch" / "root"))
    team = os.stat(shared / ".mlaunch")
    assert st.S_IMODE(team.st_mode) == 0o1777, oct(team.st_mode)
    assert st.S_IMODE(os.stat(mine).st_mode) == 0o700
    other = tmp_path / "other"
    other.mkdir()
    (other / ".mlaunch").mkdir()
    os.chown(other / ".mlaunch", 12345, 12345)
    assert fsmode.user_dir(str(other / ".mlaunch" / "root")) == str(other / ".mlaunch" / "root")
    linked = tmp_path / "linked"
    linked.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    os.symlink(target, linked / ".mlaunch")
    with pytest.raises(fsmode.UnsafePath) as e:
        fsmode.user_dir(str(linked / ".mlaunch" / "root"))
    assert "a link (to" in str(e.value.lines()[0]) and os.listdir(target) == []

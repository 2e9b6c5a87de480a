"""Files other users can read (issue 24, sections 3 and 4): every file of a run 0600 in 0700
directories, the node run dir per user, and a secret under any name masked everywhere.

The canary scan runs as `nobody` (setpriv) over every place a run writes and over /proc, while
the job runs and after it ended."""
from __future__ import annotations

import getpass
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from .loadfactor import limit
from .helpers import ROOT, mlaunch, script_job, write_spec

CANARY = "canarypw"
DB_URL = f"postgres://u:{CANARY}@h/db"
SHORT = "q7z"   # a 3-character secret
ENV = {"DB_URL": DB_URL, "SHORT": SHORT}


def _world_dir() -> str:
    """A 0755 directory under /tmp: `nobody` can reach what mlaunch leaves readable in it."""
    d = tempfile.mkdtemp(prefix="mlaunch-i24-", dir="/tmp")
    os.chmod(d, 0o755)
    return d


def as_nobody_grep(paths: list[str], needle: str) -> list[str]:
    """Every file under paths, and every /proc/*/cmdline and environ, in which `nobody`
    (no groups) can read needle."""
    script = ('for p in "$@"; do grep -rlaF -- "$NEEDLE" "$p" 2>/dev/null; done; '
              'for f in /proc/[0-9]*/cmdline /proc/[0-9]*/environ; do '
              'grep -laF -- "$NEEDLE" "$f" 2>/dev/null; done; true')
    r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                        "sh", "-c", script, "scan", *paths], env={"NEEDLE": needle, "PATH": os.environ["PATH"]},
                       capture_output=True, text=True, timeout=limit(120))
    return [ln for ln in r.stdout.splitlines() if ln and not _scanner(ln)]


def _scanner(path: str) -> bool:
    """A /proc entry of the scan itself (nobody's processes hold the needle in their own
    environment); one that is gone by now was one of those."""
    if not path.startswith("/proc/"):
        return False
    try:
        return os.stat(os.path.dirname(path)).st_uid == 65534
    except FileNotFoundError:
        return True


def _mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def canary_spec(hs, tmp: str, go: str) -> dict:
    spec = script_job([h.ip for h in hs.hosts], 1, "print_secrets.py", [go], os.path.join(tmp, "out"), hs=hs)
    spec["cluster"]["env"] = {"DB_URL": "${DB_URL}", "SHORT": "${SHORT}"}
    return spec


@pytest.mark.multihost
def test_canary_secret_is_in_no_file_or_process_another_user_reads(make_hostset):
    tmp = _world_dir()
    home = os.path.join(tmp, "home")
    os.makedirs(os.path.join(tmp, "out", "logs"))
    os.mkdir(home)
    os.chmod(home, 0o755)                       # an existing 0755 MLAUNCH_HOME
    os.chmod(os.path.join(tmp, "out"), 0o755)
    os.chmod(os.path.join(tmp, "out", "logs"), 0o755)
    control = os.path.join(tmp, "control.txt")  # proves the scan sees what is readable
    with open(control, "w") as fh:
        fh.write(CANARY)
    os.chmod(control, 0o644)
    go = os.path.join(tmp, "go")
    base = f"/tmp/mlaunch-{getpass.getuser()}"
    with make_hostset(2) as hs:
        path = write_spec(tmp, canary_spec(hs, tmp, go))
        env = {**os.environ, **ENV, "MLAUNCH_HOME": home}
        proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", path], cwd=ROOT,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if sum("ready rank" in ln for ln in lines) == 2:
                break
        try:
            seen = as_nobody_grep([tmp, base], CANARY)
            assert seen == [control], seen           # while the ranks run: files and /proc
        finally:
            open(go, "w").close()
        out, _ = proc.communicate(timeout=limit(300))
        text = "".join(lines) + out
        assert proc.returncode == 0, text[-3000:]
    assert CANARY not in text and f" {SHORT}" not in text and "db *** short ***" in text
    assert as_nobody_grep([tmp, base], CANARY) == [control]
    assert as_nobody_grep([tmp, base], SHORT) == []
    run_id = next(ln.split()[2].rstrip(":") for ln in text.splitlines() if ln.startswith("[mlaunch] run "))
    logs = os.path.join(tmp, "out", "logs", run_id)
    assert _mode(logs) == 0o700 and _mode(os.path.join(home, "runs", run_id)) == 0o700
    files = [os.path.join(logs, f) for f in os.listdir(logs)]
    files += [os.path.join(home, f) for f in os.listdir(home) if f.startswith("runs.db")]
    files += [os.path.join(home, "runs", run_id, "console.log")]
    assert len(files) >= 6 and {f: _mode(f) for f in files} == {f: 0o600 for f in files}
    run_dir = os.path.join(base, ".mlaunch", run_id)
    assert [_mode(d) for d in (base, os.path.dirname(run_dir), run_dir)] == [0o700] * 3
    r = mlaunch("ps", "--all", "--json", env={"MLAUNCH_HOME": home})
    assert r.returncode == 0 and run_id in r.stdout and CANARY not in r.stdout


@pytest.mark.multihost
def test_run_dir_of_another_user_is_refused(make_hostset):
    tmp = _world_dir()
    work = os.path.join(tmp, "work")
    mine = os.path.join(work, ".mlaunch", getpass.getuser())   # the per-user dir (issue 51)
    os.makedirs(mine)
    os.chown(mine, 65534, 65534)   # nobody's
    with make_hostset(2) as hs:
        spec = canary_spec(hs, tmp, os.path.join(tmp, "go"))
        spec["cluster"]["workdir"] = work
        r = mlaunch("submit", write_spec(tmp, spec), "--no-preflight",
                    env={**ENV, "MLAUNCH_HOME": os.path.join(tmp, "home")})
    assert r.returncode == 2, r.stdout + r.stderr
    assert (f"{mine} on " in r.stderr and "belongs to nobody (uid 65534), not to root (uid 0); "
            "remove it as its owner, or set cluster.workdir to a directory of yours; nothing was started"
            in r.stderr), r.stderr
    assert os.listdir(mine) == []


def test_dry_run_and_render_mask_any_reference_and_url_passwords(tmp_path):
    """A URL password in script.args is refused (it would sit in the rank's /proc cmdline),
    its value shown nowhere; cluster.env's references and URL passwords are masked in the dry
    run and in every rendered file (0600 in a 0700 dir)."""
    spec = {"name": "t", "trainer": "script", "script": {"path": "x.py", "args": ["--db", f"mysql://a:{CANARY}9@h"]},
            "cluster": {"hosts": ["localhost"], "gpus_per_node": 1,
                        "env": {"DB_URL": "${DB_URL}", "SHORT": "${SHORT}", "MIRROR": "https://m:pw2x@mirror"}}}
    r = mlaunch("submit", write_spec(tmp_path, spec), "--dry-run", env=ENV)
    assert r.returncode == 2 and "script.args[1]: a URL with a password" in r.stderr, r.stderr
    assert CANARY not in r.stdout + r.stderr
    spec["script"]["args"] = ["--db-from-env"]
    path = write_spec(tmp_path, spec)
    r = mlaunch("submit", path, "--dry-run", env=ENV)
    assert r.returncode == 0, r.stderr
    assert CANARY not in r.stdout and "pw2x" not in r.stdout and f"={SHORT}" not in r.stdout
    assert "MIRROR=" in r.stdout or "MIRROR" in r.stdout
    out = str(tmp_path / "out")
    r = mlaunch("render", path, "--out", out, env=ENV)
    assert r.returncode == 0, r.stderr
    for name in os.listdir(out):
        body = open(os.path.join(out, name)).read()
        assert CANARY not in body and SHORT not in body and "pw2x" not in body, name
        assert _mode(os.path.join(out, name)) == 0o600
    assert _mode(out) == 0o700


@pytest.mark.parametrize("field,value,what", [
    ("extra_sbatch", {"export": "ALL,HF_TOKEN=hf_abc123"}, ("cluster.slurm.extra_sbatch.export", "holds HF_TOKEN=***, a secret")),
    ("extra_sbatch", {"comment": "postgres://u:canarypw@h/db"}, ("cluster.slurm.extra_sbatch.comment", "holds a URL with a password")),
    ("account", DB_URL, ("cluster.slurm.account", "holds a URL with a password")),
])
def test_secret_in_a_batch_script_field_is_refused(tmp_path, field, value, what):
    spec = {"name": "t", "trainer": "script", "script": {"path": "x.py"}, "output_dir": str(tmp_path / "o"),
            "cluster": {"scheduler": "slurm", "gpus_per_node": 1, "shared_dir": str(tmp_path),
                        "slurm": {"nodes": 1, field: value}}}
    r = mlaunch("submit", write_spec(tmp_path, spec), "--dry-run")
    assert r.returncode == 2, r.stdout + r.stderr
    line = next(ln for ln in r.stderr.splitlines() if what[0] in ln)
    assert line.endswith(f"{what[0]}: {what[1]}, and Slurm stores the batch script this lands in "
                         "(scontrol write batch_script shows it); remove it and put the value in "
                         "cluster.env (e.g. HF_TOKEN: ${HF_TOKEN}), which mlaunch hands the nodes "
                         "in a 0600 file, not in the script"), line
    assert "canarypw" not in r.stderr and "hf_abc123" not in r.stderr


def test_staged_files_land_whole_and_0600_in_one_script(tmp_path):
    """The SSH executor's staging script (render.stage_script, run through the nodes' own
    bootstrap): every byte as planned, 0600 even over an older 0644 file, nothing left under
    a temporary name; a file that cannot be written ends it with exit 97 and one line."""
    from launcher import render
    run_dir = str(tmp_path / "base" / ".mlaunch" / "r1")
    os.makedirs(run_dir)
    old = os.path.join(run_dir, "ds_config.json")
    with open(old, "w") as fh:
        fh.write("an older attempt's\n")
    os.chmod(old, 0o644)
    files = [(os.path.join(run_dir, "lf.yaml"), f"token: {CANARY}\nname: é'\"$HOME`\n"),
             (old, "{}"), (os.path.join(run_dir, "empty.txt"), "")]

    def stage(files):
        return subprocess.run(["/bin/sh", "-c", render.bootstrap()], input=staging(files),
                              capture_output=True, timeout=limit(60))

    def staging(files):
        return render.framed(render.stage_script(run_dir, False, files))
    # Hosts that share a filesystem stage into one directory at once: eight at a time here.
    procs = [subprocess.Popen(["/bin/sh", "-c", render.bootstrap()], stdin=subprocess.PIPE,
                              stderr=subprocess.PIPE) for _ in range(8)]
    for p in procs:
        p.stdin.write(staging(files))
        p.stdin.close()
    assert [(p.wait(timeout=limit(60)), p.stderr.read()) for p in procs] == [(0, b"")] * 8
    for path, content in files:
        assert open(path, encoding="utf-8").read() == content and _mode(path) == 0o600, path
    assert sorted(os.listdir(run_dir)) == ["ds_config.json", "empty.txt", "lf.yaml"]
    # A node without base64: one line that names it, nothing written.
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("mkdir", "stat", "id", "chmod", "rm", "mv", "hostname", "head"):
        os.symlink(shutil.which(tool), bare / tool)
    r = subprocess.run(["/bin/sh", "-c", render.bootstrap()], input=staging([(os.path.join(run_dir, "new"), "x")]),
                       capture_output=True, timeout=limit(60), env={"PATH": str(bare)})
    assert r.returncode == 97 and r.stderr.decode().strip().splitlines()[-1] == (
        f"mlaunch: base64 (coreutils or busybox) is missing on {os.uname().nodename}; install it there "
        "to stage the run's files"), r
    assert not os.path.exists(os.path.join(run_dir, "new"))
    blocked = os.path.join(run_dir, "taken")
    os.mkdir(blocked)          # a directory where a file should go
    r = stage([(blocked, "x")])
    assert r.returncode == 97, r
    assert r.stderr.decode().strip().endswith(f"mlaunch: cannot write {blocked} on {os.uname().nodename}"), r.stderr

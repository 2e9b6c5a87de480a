"""Issue 51, the secrets (items 4, 8, 10, 11): one masking function behind every output, JSON
included; no secret on a command line another user reads in /proc; Slurm node logs masked and
0600; the relay masks a secret its cut of an endless line falls inside; literal secrets in
cluster.setup refused; a quoted override value kept as text."""
from __future__ import annotations

import glob
import json
import os
import stat
import subprocess
import sys

import pytest

from launcher.nodeprog import relay as relay_mod
from launcher.plan.launch_plan import MASK
from launcher.spec.secret_rules import mask_rules, mask_text

from .helpers import ROOT, mlaunch, script_job, write_spec
from .loadfactor import limit

SHORT = "q7z"                       # a 3-character secret under a plain name
PASSWORD = "pw-Zx81-" + "k" * 8     # a URL password
TOKEN = "wb_" + "9f3e1d0c7b6a5948"  # a secret-named variable's value


def _spec(tmp_path, script: str, args: list[str], **cluster) -> str:
    return write_spec(tmp_path, script_job(["localhost"], 1, script, args, str(tmp_path / "out"),
                                           **cluster))


def test_4_json_dry_run_masks_what_the_text_dry_run_masks(tmp_path):
    """A `${NAME}` secret under a plain name (MY_CRED), 3 characters long, is *** in every
    field of `--dry-run --json` (env and argv), as in the text dry run."""
    path = _spec(tmp_path, "wait_for_file.py", [SHORT, f"--x={SHORT}"],
                 env={"MY_CRED": "${MY_CRED}", "PLAIN": "kept"})
    env = {"MY_CRED": SHORT}
    as_json = mlaunch("submit", path, "--dry-run", "--json", env=env)
    text = mlaunch("submit", path, "--dry-run", env=env)
    assert as_json.returncode == 0 and text.returncode == 0, as_json.stderr + text.stderr
    node = json.loads(as_json.stdout)["nodes"][0]
    assert node["env"] == {"MY_CRED": MASK, "PLAIN": "kept"}
    assert node["argv"][-2:] == [MASK, f"--x={MASK}"]
    assert f'"{SHORT}"' not in as_json.stdout and f"={SHORT}" not in as_json.stdout
    assert "MY_CRED=***" in text.stdout and SHORT not in text.stdout.replace(str(tmp_path), "")


def _cmdlines() -> dict[int, bytes]:
    out = {}
    for p in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(p, "rb") as fh:
                out[int(p.split("/")[2])] = fh.read()
        except OSError:
            pass
    return out


@pytest.mark.launches
def test_8_secrets_are_refused_on_command_lines_and_reach_the_rank_by_environment(tmp_path):
    """A URL password in script.args and a literal secret override are refused (exit 2, the
    `${NAME}` way in one line); passed that way, while the rank runs, no process's
    /proc/<pid>/cmdline (mlaunch's, torchrun's, the rank's) holds either, the rank's
    environment does, and the console shows ***."""
    url = f"https://user:{PASSWORD}@db.example/x"
    go = str(tmp_path / "go")
    refused = _spec(tmp_path, "print_secrets.py", [go, url], env={"SHORT": "abcd"})
    r = mlaunch("submit", refused, "--dry-run", "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "script.args[1]: a URL with a password would show on torchrun's and the rank's " \
           "command line" in r.stderr and "DATA_URL: ${DATA_URL}" in r.stderr
    assert PASSWORD not in r.stdout + r.stderr
    r = mlaunch("submit", refused, f"cluster.env.X_PASSWORD={TOKEN}", "--dry-run")
    assert r.returncode == 2 and TOKEN not in r.stdout + r.stderr
    assert "override cluster.env.X_PASSWORD: a secret on the command line stays in mlaunch's " \
           "argv" in r.stderr and "cluster.env.X_PASSWORD='${X_PASSWORD}'" in r.stderr, r.stderr

    path = _spec(tmp_path, "print_secrets.py", [go], env={"DB_URL": "${DB_URL}", "SHORT": "${SHORT}"})
    env = {**os.environ, "DB_URL": url, "SHORT": "s7Q", "X_PASSWORD": TOKEN}
    env.pop("MLAUNCH_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", path,
                             "cluster.env.X_PASSWORD=${X_PASSWORD}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "ready rank" in line:
                break
        rank = int(lines[-1].split()[-1])
        cmdlines = _cmdlines()
        with open(f"/proc/{rank}/environ", "rb") as fh:
            environ = fh.read().split(b"\0")
    finally:
        open(go, "w").close()
    out, _ = proc.communicate(timeout=limit(120))
    text = "".join(lines) + out
    assert proc.returncode == 0, text[-3000:]
    assert b"print_secrets.py" in cmdlines[rank]     # the rank itself was read
    assert proc.pid in cmdlines and b"${X_PASSWORD}" in cmdlines[proc.pid]
    leaks = {pid: c for pid, c in cmdlines.items() if PASSWORD.encode() in c or TOKEN.encode() in c}
    assert leaks == {}, leaks
    assert f"DB_URL={url}".encode() in environ and f"X_PASSWORD={TOKEN}".encode() in environ
    assert "db *** short ***" in text and PASSWORD not in text


@pytest.mark.multihost
def test_10_slurm_node_logs_are_masked_and_0600(slurm2, tmp_path):
    """A rank that prints WANDB_API_KEY: the node log under output_dir/logs/<run> shows ***
    and is 0600, as the console; srun's raw output, in the 0700 run dir, is gone at the end."""
    from .slurmjobs import slurm_script_job, submit
    script = tmp_path / "print_key.py"
    script.write_text("import os\nprint('key', os.environ['WANDB_API_KEY'], 'rank',"
                      " os.environ['RANK'], flush=True)\n")
    spec = slurm_script_job(tmp_path, str(script), [], nproc=1, env={"WANDB_API_KEY": "${WANDB_API_KEY}"})
    r = submit(slurm2, tmp_path, spec, env={"WANDB_API_KEY": TOKEN})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert TOKEN not in r.stdout + r.stderr and "key *** rank 0" in r.stdout
    logs = glob.glob(str(tmp_path / "out" / "logs" / "*" / "node*-*.log"))
    assert len(logs) == 2, logs
    for log in logs:
        content = open(log, encoding="utf-8").read()
        assert "key *** rank" in content and TOKEN not in content, content
        assert stat.S_IMODE(os.stat(log).st_mode) == 0o600
    assert glob.glob(str(tmp_path / "shared" / ".mlaunch" / "**" / "output"), recursive=True)
    assert glob.glob(str(tmp_path / "shared" / ".mlaunch" / "**" / "output" / "*.log"),
                     recursive=True) == []


SECRETS = ("hf_" + "a1b2c3d4e5f6", "tok-9", "ab")


class _Running:
    """The command pump() follows: its output's fd, and an end that has not come."""

    def __init__(self, fd: int):
        self.fd = fd

    def poll(self):
        return None


def _pumped(monkeypatch, tmp_path, data: bytes) -> bytes:
    """What the relay's pump sends to the node log for data read from a regular file (reads of
    READ bytes each: the cut of an endless line falls at HOLD - overlap, every time)."""
    sent = []
    monkeypatch.setattr(relay_mod, "send", lambda fd, b: sent.append(b) if fd == 1 else None)
    src = tmp_path / "line"
    src.write_bytes(data)
    fd = os.open(src, os.O_RDONLY)
    try:
        relay_mod.pump(relay_mod.Relay(mask_rules(SECRETS, MASK)), _Running(fd))
    finally:
        os.close(fd)
    return b"".join(sent)


def test_11_a_secret_across_the_relays_cut_of_an_endless_line_is_masked(monkeypatch, tmp_path):
    """An endless line (no newline) with a secret at each offset across the relay's 1 MiB
    cut: the node log holds exactly what masking the whole line gives, never a piece."""
    secret = SECRETS[0].encode()
    cut = relay_mod.HOLD - relay_mod.Relay(mask_rules(SECRETS, MASK)).overlap
    for offset in range(1, len(secret)):
        data = bytearray(b"x" * (relay_mod.HOLD + 4096))
        data[cut - offset:cut - offset + len(secret)] = secret
        out = _pumped(monkeypatch, tmp_path, bytes(data) + b"\n")
        assert out == mask_text(data.decode() + "\n", SECRETS, MASK).encode(), offset
        assert b"a1b2" not in out and b"c3d4e5f6" not in out and b"e5f6" not in out


def test_11_literal_secrets_in_setup_are_refused_and_a_quoted_override_stays_text(tmp_path):
    """cluster.setup `export API_TOKEN=...` is refused with the `${NAME}` way (nothing shown,
    exit 2); `cluster.env.X="3"` reaches the nodes as the string "3"."""
    path = _spec(tmp_path, "wait_for_file.py", ["go"],
                 setup=[f"export API_TOKEN={TOKEN}", "export HF_TOKEN=$(cat ~/.hf)"])
    r = mlaunch("submit", path, "--dry-run")
    assert r.returncode == 2 and TOKEN not in r.stdout + r.stderr and "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "cluster.setup" in ln]
    assert len(lines) == 1 and "cluster.setup[0]: sets API_TOKEN to a literal value" in lines[0]
    assert "API_TOKEN: ${API_TOKEN} with API_TOKEN exported in this shell" in lines[0]
    path = _spec(tmp_path, "wait_for_file.py", ["go"])
    r = mlaunch("submit", path, "--dry-run", "--json", 'cluster.env.X="3"', "cluster.env.Y='1e-5'")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["nodes"][0]["env"] == {"X": "3", "Y": "1e-5"}


@pytest.mark.parametrize("override", ["cluster.env.DB_PASSWORD=123456",
                                      "cluster.env={API_TOKEN: abc123xyz, PLAIN: 1}"])
def test_8_a_secret_override_of_any_type_or_as_a_mapping_is_refused(override):
    """A numeric secret (YAML reads 123456 as an int) and a secret inside a cluster.env
    mapping stay in mlaunch's argv just the same: refused, the value never echoed."""
    from launcher.errors import SpecError
    from launcher.spec.overrides import parse
    with pytest.raises(SpecError) as e:
        parse([override])
    (line,) = [str(p) for p in e.value.problems]
    assert "a secret on the command line stays in mlaunch's argv" in line, line
    assert "123456" not in line and "abc123xyz" not in line, line


def test_4_a_referenced_secret_with_a_dollar_is_masked_in_the_dry_run(tmp_path):
    """MY_KEY: ${SRC} whose value holds a `$`: the dry run showed it in clear (the mask held the
    value with its `$` doubled, as the spec keeps it; the nodes get it with one)."""
    path = _spec(tmp_path, "env_job.py", [], env={"MY_KEY": "${SRC}"})
    for extra in ([], ["--json"], ["--full"]):
        r = mlaunch("submit", path, "--dry-run", *extra, env={"SRC": "zz$qqRSTU"})
        assert r.returncode == 0, r.stderr
        assert "qqRSTU" not in r.stdout + r.stderr, (extra, r.stdout)

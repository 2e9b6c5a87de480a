"""Issue 51, items 5 and 7: `mlaunch exec` quotes cluster.workdir and fails where it is
missing (never runs the command in the login directory); every input file mlaunch reads is
read only when regular and within a size cap, and YAML aliases are bounded.

The input tests run mlaunch under an address-space limit, so a regression (reading
/dev/zero or a 100 MB file whole, expanding an alias bomb) fails here rather than eating
the machine; a control spec validates under the same limit."""
from __future__ import annotations

import os
import re
import resource
import shlex

import pytest

from .helpers import ROOT, mlaunch, script_job, write_spec

MEMORY_CAP = 1024 ** 3   # bytes of address space for one mlaunch process in these tests


def _bounded() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _validate(path: str):
    return mlaunch("validate", path, preexec_fn=_bounded, timeout=60)


# ---- item 5: mlaunch exec and cluster.workdir ---------------------------------------------

def _injecting_workdir(tmp_path, create: bool) -> tuple[str, str]:
    """(a workdir whose text would create the marker if a shell expanded it, the marker)."""
    marker = str(tmp_path / "MARKER")
    workdir = str(tmp_path / "w$(touch ") + marker + ")"
    if create:
        os.makedirs(workdir)
    return workdir, marker


@pytest.mark.launches
def test_exec_runs_in_a_workdir_holding_a_command_substitution_literally(tmp_path):
    workdir, marker = _injecting_workdir(tmp_path, create=True)
    spec = write_spec(tmp_path, script_job(["localhost"], 1, "steps.py", [], str(tmp_path / "o"),
                                           workdir=workdir))
    r = mlaunch("exec", spec, "--", "pwd")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"[node0 localhost] {workdir}\n" in r.stdout
    # The same text as an override, the directory missing this time: refused, nothing run.
    over = mlaunch("exec", spec, f"cluster.workdir={workdir}x", "--", "pwd")
    assert over.returncode == 1 and "[node0 localhost] /" not in over.stdout
    assert not os.path.exists(marker)


@pytest.mark.multihost
def test_exec_on_namespace_hosts_quotes_the_workdir_and_fails_where_it_is_missing(make_hostset, tmp_path):
    workdir, marker = _injecting_workdir(tmp_path, create=True)
    ran = tmp_path / "RAN"
    with make_hostset(2) as hs:
        ips = [h.ip for h in hs.hosts]
        spec = write_spec(tmp_path, script_job(ips, 1, "steps.py", [], str(tmp_path / "o"), hs=hs,
                                               workdir=workdir))
        r = mlaunch("exec", spec, "--", "pwd")
        assert r.returncode == 0, r.stdout + r.stderr
        for i, ip in enumerate(ips):
            assert f"[node{i} {ip}] {workdir}\n" in r.stdout
        missing = str(tmp_path / "nowhere")
        gone = mlaunch("exec", spec, f"cluster.workdir={missing}", "--", f"touch {ran}; pwd")
    assert gone.returncode == 1, gone.stdout + gone.stderr
    for i, ip in enumerate(ips):
        said = [ln for ln in gone.stdout.splitlines() if ln.startswith(f"[node{i} {ip}] ")]
        assert said == [f"[node{i} {ip}] mlaunch exec: cluster.workdir {shlex.quote(missing)} is not a directory "
                        f"on {ip}; the command did not run there: create it or fix cluster.workdir"]
    assert "exec: 0 of 2 nodes succeeded; 2 failed\n" in gone.stdout
    assert not ran.exists() and not os.path.exists(marker)


@pytest.mark.launches
def test_exec_with_a_missing_workdir_never_runs_in_the_login_directory(tmp_path):
    ran, missing = tmp_path / "RAN", str(tmp_path / "nowhere")
    spec = write_spec(tmp_path, script_job(["localhost"], 1, "steps.py", [], str(tmp_path / "o"),
                                           workdir=missing))
    r = mlaunch("exec", spec, "--", f"touch {ran}")
    assert r.returncode == 1, r.stdout + r.stderr
    said = [ln for ln in r.stdout.splitlines() if ln.startswith("[node0 localhost] ")]
    assert said == [f"[node0 localhost] mlaunch exec: cluster.workdir {missing} is not a directory on "
                    "localhost; the command did not run there: create it or fix cluster.workdir"]
    assert re.search(r"^\[mlaunch\] 0 +localhost 2$", r.stdout, re.M), r.stdout
    assert not ran.exists()


# ---- item 7: bounded inputs -----------------------------------------------------------------

def _quick_spec(tmp_path, extra: str = "") -> str:
    """configs/quickstart.yaml with absolute paths, plus extra YAML text at its end."""
    with open(os.path.join(ROOT, "configs", "quickstart.yaml"), encoding="utf-8") as fh:
        text = fh.read().replace(".quickstart", os.path.join(ROOT, ".quickstart"))
    path = tmp_path / "job.yaml"
    path.write_text(text + extra, encoding="utf-8")
    return str(path)


def _billion_laughs() -> str:
    """Nine levels of nine-fold aliases (9^9 strings) under a passthrough key LLaMA-Factory
    accepts, so that only the alias bound can refuse it."""
    lines = ["passthrough:", "  generation_config:", '    a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"    {name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_a_bounded_control_spec_with_a_small_alias_still_validates(tmp_path):
    spec = _quick_spec(tmp_path, "passthrough:\n  generation_config: &s {top_k: 5}\n  vllm_config: *s\n")
    r = _validate(spec)
    assert r.returncode == 0 and r.stdout.endswith(": ok (llamafactory, 1 node × 2 processes)\n"), r.stderr


@pytest.mark.parametrize("case", ["dev-zero", "fifo", "100MB", "billion-laughs", "hostfile-fifo",
                                  "ds-config-dev-zero"])
def test_validate_refuses_an_unbounded_or_hanging_input_in_one_line(tmp_path, case):
    path, want = _input_case(tmp_path, case)
    r = _validate(path)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert want in lines[-1], r.stderr
    assert len(lines) == (2 if case in ("hostfile-fifo", "ds-config-dev-zero") else 1), r.stderr
    assert "Traceback" not in r.stderr


def _input_case(tmp_path, case: str) -> tuple[str, str]:
    """(the JOB argument, the text its one problem line holds)."""
    fifo = str(tmp_path / "fifo")
    if case == "dev-zero":
        return "/dev/zero", "/dev/zero: the spec is a character device, not a regular file"
    if case in ("fifo", "hostfile-fifo"):
        os.mkfifo(fifo)
    if case == "fifo":
        return fifo, f"{fifo}: the spec is a FIFO, not a regular file"
    if case == "hostfile-fifo":
        spec = write_spec(tmp_path, script_job(["localhost"], 1, "steps.py", [], str(tmp_path / "o")))
        return _with_hostfile(spec), f"cluster.hostfile: {fifo}: the hostfile is a FIFO"
    if case == "100MB":
        big = _hundred_mb(tmp_path)
        return big, (f"{big}: the spec is {os.path.getsize(big):,} bytes, over mlaunch's cap of "
                     "1,048,576 bytes (1 MiB) for a spec; is this the right file?")
    if case == "billion-laughs":
        return _quick_spec(tmp_path, _billion_laughs()), "YAML aliases (*name) repeat over 100,000 nodes"
    return (_quick_spec(tmp_path, "deepspeed:\n  config: /dev/zero\n"),
            "deepspeed.config: /dev/zero: the deepspeed.config is a character device, not a regular file")


def _with_hostfile(spec: str) -> str:
    """spec rewritten to take its hosts from the hostfile `fifo` beside it."""
    import yaml
    with open(spec, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    del data["cluster"]["hosts"]
    data["cluster"]["hostfile"] = "fifo"
    with open(spec, "w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh)
    return spec


def _hundred_mb(tmp_path) -> str:
    """A 100 MB YAML mapping of keys no spec has (what took minutes and 1 GB to refuse)."""
    path = tmp_path / "big.yaml"
    block = "".join(f"unknown_key_{i}: {i}\n" for i in range(10_000)).encode()
    with open(path, "wb") as fh:
        fh.write(b"name: big\n")
        while fh.tell() < 100 * 1024 * 1024:
            fh.write(block)
    return str(path)


def test_an_alias_bomb_given_as_an_override_is_one_line(tmp_path):
    """The same bound on the command line: a 9^7 alias bomb as a passthrough override is
    refused before anything expands it (validate: exit 2, one line naming the override),
    under the same 1 GiB address-space limit."""
    import subprocess
    import sys
    spec = write_spec(tmp_path, {"name": "t", "trainer": "script", "script": {"path": "x.py"},
                                 "cluster": {"hosts": ["localhost"], "gpus_per_node": 1}})
    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"] + [
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(6)]
    bomb = "{" + ", ".join(levels) + "}"
    r = subprocess.run([sys.executable, "-m", "launcher.cli", "validate", spec,
                        f"passthrough.generation_config={bomb}"], capture_output=True, text=True,
                       timeout=120, preexec_fn=_bounded, cwd=ROOT)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in r.stderr and any(
        "override passthrough.generation_config: YAML aliases (*name) repeat over 100,000 nodes" in ln
        for ln in lines), r.stderr

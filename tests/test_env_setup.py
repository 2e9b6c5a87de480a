"""cluster.env references to the node's own environment, and cluster.setup (issue 31): the
rendered shell, the spec's refusals, and real runs on namespace hosts."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from launcher import render
from launcher.plan.launch_plan import user_env
from launcher.spec.env_refs import check_env_refs

from .helpers import mlaunch, script_job, write_spec

ENV = {"MLAUNCH_T_PATH": "/opt/x/bin:$PATH", "LD_LIBRARY_PATH": "/opt/x/lib:${LD_LIBRARY_PATH}",
       "MLAUNCH_T_DOLLAR": "it's a$$b", "HF_TOKEN": "ab$cd"}


def _sh(env: dict, node_env: dict) -> dict:
    """What /bin/sh exports after the node script's export lines, given the node's env."""
    lines = [f"export {k}={render.quote(v)}" for k, v in user_env(env).items()]
    code = "\n".join(lines) + "\nfor n in " + " ".join(env) + '; do printf "%s=%s\\n" "$n" "$(printenv "$n")"; done'
    out = subprocess.run(["/bin/sh", "-c", code], env=node_env, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_references_expand_from_the_node_and_the_rest_stays_literal():
    got = _sh(ENV, {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/n/lib"})
    assert got == {"MLAUNCH_T_PATH": "/opt/x/bin:/usr/bin:/bin", "LD_LIBRARY_PATH": "/opt/x/lib:/n/lib",
                   "MLAUNCH_T_DOLLAR": "it's a$b", "HF_TOKEN": "ab$cd"}


def test_an_unset_path_list_adds_no_empty_entry():
    got = _sh({"LD_LIBRARY_PATH": "/opt/x/lib:$LD_LIBRARY_PATH", "P": "$NOPE:/b"}, {"PATH": "/bin"})
    assert got == {"LD_LIBRARY_PATH": "/opt/x/lib", "P": "/b"}


@pytest.mark.parametrize("value", ["${X:-/opt}", "$(hostname)/x", "a${X"])
def test_shell_forms_beyond_a_reference_are_refused_with_the_fix(value):
    (p,) = check_env_refs({"MYVAR": value})
    assert p.path == "cluster.env.MYVAR"
    assert "only $NAME and ${NAME} are expanded" in p.message and "write $$ for a literal $" in p.message
    assert "cluster.setup" in p.message


def test_dry_run_shows_the_references_and_the_setup(tmp_path):
    spec = script_job(["localhost"], 1, "env_job.py", [], str(tmp_path / "out"))
    spec["cluster"].update(env={"LD_LIBRARY_PATH": "/opt/x/lib:$LD_LIBRARY_PATH"},
                           setup=["module load cuda", ". ./env.sh"])
    r = mlaunch("submit", write_spec(tmp_path, spec), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "  env: LD_LIBRARY_PATH=/opt/x/lib:${LD_LIBRARY_PATH}\n" in r.stdout
    assert "expanded on each node from its own environment: ${LD_LIBRARY_PATH}" in r.stdout
    assert ("cluster.setup before torchrun, in the node's shell (a failing line fails that node, "
            "exit 95): module load cuda; . ./env.sh;") in r.stdout


def _env_lines(stdout: str) -> list[dict]:
    return [json.loads(m) for m in re.findall(r"env (\{.*\})$", stdout, re.M)]


@pytest.mark.multihost
def test_ranks_see_the_expanded_variables_and_what_setup_set(make_hostset, tmp_path):
    with make_hostset(2) as hs:
        spec = script_job([h.ip for h in hs.hosts], 1, "env_job.py", [], str(tmp_path / "out"), hs=hs)
        spec["cluster"].update(env={k: v for k, v in ENV.items() if k != "HF_TOKEN"},
                               setup=['export MLAUNCH_T_SETUP="from setup on $(uname -s)"'])
        r = mlaunch("submit", write_spec(tmp_path, spec), timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    lines = _env_lines(r.stdout)
    assert sorted(x["rank"] for x in lines) == ["0", "1"]
    for x in lines:
        assert x["MLAUNCH_T_PATH"].startswith("/opt/x/bin:/") and "$" not in x["MLAUNCH_T_PATH"]
        assert x["LD_LIBRARY_PATH"].startswith("/opt/x/lib") and "$" not in x["LD_LIBRARY_PATH"]
        assert x["MLAUNCH_T_DOLLAR"] == "it's a$b"
        assert x["MLAUNCH_T_SETUP"] == "from setup on Linux"


@pytest.mark.multihost
@pytest.mark.parametrize("line, code", [(". /nonexistent/env.sh", r"\d+"), ("sh -c 'exit 3'", "3")])
def test_a_failing_setup_line_fails_the_node_with_its_line(make_hostset, tmp_path, line, code):
    with make_hostset(2) as hs:
        spec = script_job([h.ip for h in hs.hosts], 1, "env_job.py", [], str(tmp_path / "out"), hs=hs)
        spec["cluster"]["setup"] = ["true", line]
        r = mlaunch("submit", write_spec(tmp_path, spec), timeout=180)
    assert r.returncode != 0, r.stdout[-3000:]
    assert re.search(rf"mlaunch: cluster\.setup\[1\] failed on this node \(exit {code}\): "
                     + re.escape(line), r.stdout), r.stdout[-3000:]
    assert not _env_lines(r.stdout)   # no rank started

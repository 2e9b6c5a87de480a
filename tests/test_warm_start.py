"""cluster.warm_start on one machine, without SSH: a node session's real bootstrap (the warm
frame, the stage frame, the node script, as transport/openssh.py sends them) run by sh, with a
torchrun whose `torch.distributed.run` is a stand-in module on PYTHONPATH that says where,
as what and with what it ran. The namespace-host tests run the real torchrun this way."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from launcher import render
from launcher.plan.launch_plan import build_plan
from launcher.spec import parse_spec

from .helpers import limit
from .procs import GUARD_PROGRAMS, own_name, program_name

FAKE_RUN = """import json, os, resource, signal, sys, time
while os.environ.get("FAKE_IMPORT_WAIT") and not os.path.exists(os.environ["FAKE_IMPORT_WAIT"]):
    time.sleep(0.01)   # an import that takes its time: a teardown may come meanwhile
def status(key):
    return int(open("/proc/self/status").read().split(key + ":")[1].split()[0], 16)
def main():
    umask = os.umask(0)
    os.umask(umask)
    print("FAKE " + json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "pid": os.getpid(),
                                "x": os.environ.get("FAKE_X"), "mask": status("SigBlk"),
                                "ignored": status("SigIgn"), "umask": umask,
                                "int_handler": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
                                "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                                "comm": open("/proc/self/comm").read().strip()}), flush=True)
    code = int(os.environ.get("FAKE_EXIT", "0"))
    if code < 0:
        os.kill(os.getpid(), -code)
    return code or None
"""


@pytest.fixture
def kit(tmp_path):
    """A venv-like folder whose torchrun runs the stand-in, a work dir, a temporary dir."""
    fake = tmp_path / "fake" / "torch" / "distributed"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "run.py").write_text(FAKE_RUN)
    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    os.symlink(sys.executable, bindir / "python")
    (bindir / "torchrun").write_text(f"#!{bindir}/python\nimport sys\nfrom torch.distributed.run import main\n"
                                     "sys.exit(main())\n")
    (bindir / "torchrun").chmod(0o755)
    for d in ("work", "tmp"):
        (tmp_path / d).mkdir()
    return tmp_path


def plan_for(kit, setup=(), exit_code=0, **cluster):
    spec = {"name": "warm", "trainer": "script",
            "cluster": {"hosts": ["h1", "h2"], "gpus_per_node": 1, "venv": str(kit / "venv"),
                        "workdir": str(kit / "work"), "setup": list(setup),
                        "env": {"PYTHONPATH": str(kit / "fake"), "FAKE_X": "seen",
                                "FAKE_EXIT": str(exit_code)}, **cluster},
            "health": {"sample_every_s": 0},
            "script": {"path": str(kit / "s.py"), "args": ["--a", "b c"]}}
    import yaml
    # a run id of its own: a finished session's hang-up guard ends its node id's processes
    return build_plan(parse_spec(yaml.safe_dump(spec)), run_id=own_name("warm"))


def session(kit, node, script=True):
    """The node's session as sh runs it: (its process, the frames sent on its stdin)."""
    env = {"PATH": os.environ["PATH"], "TMPDIR": str(kit / "tmp"), "HOME": str(kit)}
    proc = subprocess.Popen(["/bin/sh", "-c", render.bootstrap(True, "", "staged")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env)   # one pipe, as the relay gives the session
    frames = render.framed(node.warm) + render.framed("") + (render.framed(node.script) if script else b"")
    proc.stdin.write(frames)
    proc.stdin.flush()
    return proc


def finish(proc, node=None):
    """Its output and exit, its stdin held open (the hang-up guard's) until it ended; with
    node: also the node's processes left then, beside the guard's (which end once stdin closes,
    and would end the rest)."""
    out = b""
    for line in proc.stdout:
        out += line
    code = proc.wait(timeout=limit(60))
    others = {p for p in left(node) if program_name(p) not in GUARD_PROGRAMS} if node else None
    proc.stdin.close()
    return (out.decode(), code) if node is None else (out.decode(), code, others)


def ran(out):
    lines = [ln for ln in out.splitlines() if ln.startswith("FAKE ")]
    assert len(lines) == 1, out
    return json.loads(lines[0][5:])


def test_torchrun_runs_warm_with_the_scripts_argv_directory_and_environment(kit):
    plan = plan_for(kit)
    node = plan.nodes[0]
    assert node.warm and "mlaunch_warm" in node.script
    proc = session(kit, node)
    out, code = finish(proc)
    assert code == 0, out
    assert "mlaunch: torchrun started warm" in out
    got = ran(out)
    assert got["argv"] == list(node.argv[1:])
    assert got["cwd"] == str(kit / "work") and got["x"] == "seen"
    assert got["pid"] != proc.pid   # the warm process, not the shell exec'ing torchrun
    assert int(open(node.pidfile).read()) == got["pid"]   # the teardown's target: torchrun's group
    assert got["mask"] & (1 << (signal.SIGUSR1 - 1)) == 0   # its ranks inherit no blocked signal
    assert os.listdir(kit / "tmp") == []   # the hold directory is gone


@pytest.mark.parametrize("code", [3, -signal.SIGKILL])
def test_the_sessions_exit_is_torchruns(kit, code):
    out, got = finish(session(kit, plan_for(kit, exit_code=code).nodes[0]))
    assert "mlaunch: torchrun started warm" in out
    assert got == code, out


def test_a_setup_line_that_changes_the_import_path_declines_and_torchrun_starts_cold(kit):
    plan = plan_for(kit, setup=['export PYTHONPATH="$PYTHONPATH:/nowhere"'])
    proc = session(kit, plan.nodes[0])
    out, code = finish(proc)
    assert code == 0, out
    assert "torchrun starts cold" in out and "PYTHONPATH" in out
    assert "started warm" not in out
    got = ran(out)
    assert got["pid"] == proc.pid   # the shell exec'd torchrun itself
    assert os.listdir(kit / "tmp") == []


def test_a_setup_line_that_changes_nothing_torchrun_inherits_keeps_it_warm(kit):
    out, code = finish(session(kit, plan_for(kit, setup=["mlaunch_x=1", "export NCCL_DEBUG=INFO"]).nodes[0]))
    assert code == 0 and "mlaunch: torchrun started warm" in out, out


@pytest.mark.parametrize("line, named, field", [
    ("ulimit -n {nofile}", "max open files", "nofile"),
    ("umask 0007", "Umask", "umask"),
])
def test_a_setup_line_that_changes_what_torchrun_inherits_declines(kit, line, named, field):
    """A limit or umask set by a setup line reaches torchrun as it would without a warm start."""
    nofile = max(64, min(1024, __import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE)[0]) - 1)
    proc = session(kit, plan_for(kit, setup=[line.format(nofile=nofile)]).nodes[0])
    out, code = finish(proc)
    assert code == 0, out
    assert "torchrun starts cold" in out and named in out, out
    got = ran(out)
    assert got["pid"] == proc.pid
    assert got[field] == {"nofile": nofile, "umask": 0o007}[field]
    assert os.listdir(kit / "tmp") == []


def test_warm_torchrun_inherits_what_a_cold_one_would(kit):
    """Signal dispositions (sh starts a background job with SIGINT and SIGQUIT ignored: a warm
    torchrun's are not), the name `ps` and pgrep see, and no module of the working directory
    in place of the standard library's."""
    for name in ("signal", "ctypes", "time"):
        (kit / "work" / f"{name}.py").write_text(f"open({str(kit / 'shadowed')!r}, 'a').write({name!r})\n")
    warm, _ = finish(session(kit, plan_for(kit).nodes[0]))
    cold, _ = finish(session(kit, plan_for(kit, warm_start=False).nodes[0]))
    assert "started warm" in warm and "started warm" not in cold, (warm, cold)
    w, c = ran(warm), ran(cold)
    assert w["pid"] != c["pid"]
    for key in ("ignored", "int_handler", "comm", "umask", "nofile", "mask"):
        assert w[key] == c[key], (key, w, c)
    assert w["int_handler"] and w["comm"] == "torchrun"
    assert not (kit / "shadowed").exists()


def test_a_teardown_before_the_hand_off_is_taken_starts_nothing(kit):
    """The teardown signals the pidfile's group while torchrun's imports still run: the warm
    process ends, and the node's shell does not start torchrun cold in its place."""
    gate = kit / "imports-done"
    node = plan_for(kit, env={"PYTHONPATH": str(kit / "fake"), "FAKE_X": "seen", "FAKE_EXIT": "0",
                              "FAKE_IMPORT_WAIT": str(gate)}).nodes[0]
    proc = session(kit, node)
    deadline = time.monotonic() + limit(30)
    pid = None
    while time.monotonic() < deadline:   # the script wrote the warm process's pid: the hand-off began
        try:
            pid = int(open(node.pidfile).read())
        except (OSError, ValueError):
            pid = None
        if pid and pid != proc.pid and _leads_its_group(pid):   # as torchrun's group, the teardown's target
            break
        time.sleep(0.02)
    assert pid and pid != proc.pid, "the hand-off never began"
    os.killpg(pid, signal.SIGTERM)
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.02)
    gate.write_text("")   # a cold torchrun started now would import and run
    out, code, others = finish(proc, node)
    assert "FAKE" not in out, out
    assert code == -signal.SIGTERM, out
    assert others == set() and os.listdir(kit / "tmp") == []


def test_a_failing_setup_line_ends_the_warm_process_with_the_shell(kit):
    node = plan_for(kit, setup=["false"]).nodes[0]
    out, code, others = finish(session(kit, node), node)
    assert code != 0 and "cluster.setup[0] failed" in out, out
    assert "FAKE" not in out
    assert others == set() and os.listdir(kit / "tmp") == []


def test_a_session_that_gets_no_script_ends_its_warm_process_and_leaves_nothing(kit):
    """A check failed: the launcher closes the session's stdin before any script."""
    node = plan_for(kit).nodes[0]
    proc = session(kit, node, script=False)
    deadline = time.monotonic() + limit(20)
    while not list((kit / "tmp").glob("*/ready")) and time.monotonic() < deadline:
        time.sleep(0.02)   # `ready`: the warm program runs (the hold directory comes before its exec)
    assert left(node), "the warm process never started"
    proc.stdin.close()
    out, code = finish(proc)
    assert code == 97, out
    assert left(node) == set() and os.listdir(kit / "tmp") == []   # no guard: the script never ran


def test_warm_start_false_containers_and_localhost_have_no_warm_frame(kit):
    assert not plan_for(kit, warm_start=False).nodes[0].warm
    assert "mlaunch_warm" not in plan_for(kit, warm_start=False).nodes[0].script
    boxed = plan_for(kit, container={"image": "localhost/x:1", "gpus": False}).nodes[0]
    assert boxed.container and not boxed.warm   # the image's interpreter, not the host's
    assert "mlaunch_warm" not in boxed.script
    assert not plan_for(kit, hosts=["localhost"]).nodes[0].warm   # no login to overlap
    assert plan_for(kit).nodes[0].warm   # the same job on SSH hosts
    # two nodes of one host share its login session, which holds one warm torchrun: the
    # transport sends no frame then, and the dry run must not show one
    twice = plan_for(kit, hosts=["h1", "h1"], cuda_visible_devices=[[0], [1]])
    assert not any(n.warm or n.warm_display for n in twice.nodes)


def test_python_m_torch_distributed_run_starts_warm_on_that_interpreter(kit):
    """A distribution's interpreter (no torchrun beside it) runs torchrun's module."""
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no /usr/bin/python3 on this machine")
    spec_plan = plan_for(kit, python="/usr/bin/python3", venv=None)
    node = spec_plan.nodes[0]
    assert list(node.argv[:3]) == ["/usr/bin/python3", "-m", "torch.distributed.run"] and node.warm
    out, code = finish(session(kit, node))
    assert code == 0 and "mlaunch: torchrun started warm" in out, out
    assert ran(out)["argv"] == list(node.argv[3:])


def _leads_its_group(pid):
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def left(node):
    """This node's processes (its MLAUNCH_NODE_ID in their environment), by pid."""
    needle = ("MLAUNCH_NODE_ID=" + dict(node.env)["MLAUNCH_NODE_ID"]).encode() + b"\0"
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/environ", "rb") as fh:
                    if needle in fh.read():
                        out.add(int(d))
            except OSError:
                pass
    return out


def test_the_dry_runs_warm_frame_shows_no_secret_even_one_the_shell_quotes(kit):
    """`--dry-run --full` prints node 0's warm frame made from the masked environment: a
    secret with a quote in it is quoted in pieces for the shell, which no text mask finds."""
    from launcher.view.present import describe_plan
    secret = "pa'ss-word-123"
    plan = plan_for(kit, env={"PYTHONPATH": str(kit / "fake"), "HF_TOKEN": secret})
    assert any(secret.split("'")[1] in line for line in plan.nodes[0].warm.splitlines())   # the real frame has it
    shown = describe_plan(plan, full=True)
    assert "its session's warm frame" in shown
    assert "ss-word-123" not in shown and "HF_TOKEN=" in shown


def test_a_setup_line_that_changes_directory_declines(kit):
    """torchrun runs where the script would run it: a setup line's `cd` declines the warm start."""
    (kit / "elsewhere").mkdir()
    proc = session(kit, plan_for(kit, setup=[f"cd {kit / 'elsewhere'}"]).nodes[0])
    out, code = finish(proc)
    assert code == 0 and "torchrun starts cold" in out and "the working directory" in out, out
    got = ran(out)
    assert got["pid"] == proc.pid and got["cwd"] == str(kit / "elsewhere")

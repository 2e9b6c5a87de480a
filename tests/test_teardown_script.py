"""The node-side teardown (templates/teardown.sh.j2, render.teardown_script) run here on real
processes: TERM, the grace, KILL; node agents (torchrun) get the drain once their ranks are
gone, not the rest of the grace; its waits are measured in time, not in passes of its loop."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from launcher import render

from .helpers import limit
from .procs import job_pids, own_name

STUBBORN = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "open(sys.argv[1], 'w').close()\ntime.sleep(600)\n")
MEEK = "import sys, time\nopen(sys.argv[1], 'w').close()\ntime.sleep(600)\n"
# Ignores TERM and forks children that do too, one every 2 ms (at most 2000), as a node's
# shell still starting its hang-up guard and sampler does when a teardown comes at once.
SPAWNER = ("import os, signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
           "open(sys.argv[1], 'w').close()\n"
           "for _ in range(2000):\n"
           "    if os.fork() == 0:\n        time.sleep(600)\n        os._exit(0)\n"
           "    time.sleep(0.002)\n"
           "time.sleep(600)\n")


def _start(run_id: str, code: str, ready: str) -> subprocess.Popen:
    """A job process of run_id in a session of its own (as a node's are), once it is ready."""
    proc = subprocess.Popen([sys.executable, "-c", code, ready], start_new_session=True,
                            env={**os.environ, "MLAUNCH_RUN_ID": run_id})
    deadline = time.monotonic() + limit(30)
    while not os.path.exists(ready):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    return proc


def _teardown(run_id: str, **kw) -> subprocess.CompletedProcess:
    script = render.teardown_script(f"MLAUNCH_RUN_ID={run_id}", **kw)
    return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=limit(120))


def test_a_process_that_ignores_term_is_killed_after_the_grace(tmp_path):
    run_id = own_name("td-")
    meek = _start(run_id, MEEK, str(tmp_path / "meek"))
    stubborn = _start(run_id, STUBBORN, str(tmp_path / "stubborn"))
    r = _teardown(run_id, pidfiles=[], grace=0.5)
    assert r.returncode == 0 and r.stdout.strip() == "mlaunch-teardown: 0 left", r.stdout + r.stderr
    assert meek.wait(limit(10)) == -15 and stubborn.wait(limit(10)) == -9
    assert job_pids(run_id) == set()


def test_an_agent_gets_the_drain_once_its_ranks_are_gone_not_the_grace(tmp_path):
    """grace 600 s, drain 0.3 s: the script ends as soon as the drain has passed (a wait
    of the grace would outlast the test's timeout)."""
    run_id = own_name("td-")
    agent = _start(run_id, STUBBORN, str(tmp_path / "agent"))
    rank = _start(run_id, MEEK, str(tmp_path / "rank"))
    pidfile = tmp_path / "agent.pid"
    pidfile.write_text(str(agent.pid))
    r = _teardown(run_id, pidfiles=[str(pidfile)], grace=600, agents=[str(pidfile)], drain=0.3)
    assert r.returncode == 0 and r.stdout.strip() == "mlaunch-teardown: 0 left", r.stdout + r.stderr
    assert rank.wait(limit(10)) == -15 and agent.wait(limit(10)) == -9
    assert job_pids(run_id) == set()


# An agent as torchrun --tee: TERM ignored, its rank's log file under its --log-dir open until
# the rank is gone (then it has copied every line and closes it), then it lingers.
COPYING = ("import os, signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
           "f = open(os.path.join(sys.argv[2], 'rank.log'), 'w')\nrank = int(sys.argv[3])\n"
           "open(sys.argv[1], 'w').close()\n"
           "while os.path.exists(f'/proc/{rank}') and open(f'/proc/{rank}/stat').read().split()[2] != 'Z':\n"
           "    time.sleep(0.02)\n"
           "f.close()\ntime.sleep(600)\n")


def test_the_drain_ends_once_the_agent_holds_no_file_of_its_log_dir(tmp_path):
    """drain 600 s, grace 600 s: the agent closes its log file once its rank is gone, and the
    script KILLs it then (a wait of the drain would outlast the test's timeout)."""
    run_id = own_name("td-")
    logs = tmp_path / "torchrun" / "node0"
    logs.mkdir(parents=True)
    rank = _start(run_id, MEEK, str(tmp_path / "rank"))
    ready = tmp_path / "agent"
    agent = subprocess.Popen([sys.executable, "-c", COPYING, str(ready), str(logs), str(rank.pid)],
                             start_new_session=True, env={**os.environ, "MLAUNCH_RUN_ID": run_id})
    deadline = time.monotonic() + limit(30)
    while not ready.exists():
        assert time.monotonic() < deadline and agent.poll() is None
        time.sleep(0.02)
    pidfile = tmp_path / "agent.pid"
    pidfile.write_text(str(agent.pid))
    r = _teardown(run_id, pidfiles=[str(pidfile)], grace=600, agents=[str(pidfile)], drain=600,
                  agent_logs=[str(tmp_path / "torchrun")])
    assert r.returncode == 0 and r.stdout.strip() == "mlaunch-teardown: 0 left", r.stdout + r.stderr
    assert rank.wait(limit(10)) == -15 and agent.wait(limit(10)) == -9
    assert job_pids(run_id) == set()


def test_the_samplers_session_is_killed_at_once_not_given_the_grace(tmp_path):
    """The live view's sampler (its pid in the node pidfile's .sampler) is KILLed first:
    nvidia-smi in it takes up to a second to end on a SIGTERM. Here it ignores TERM and the
    grace is 600 s: a teardown that waited for it would outlast the test's timeout."""
    run_id = own_name("td-")
    sampler = _start(run_id, STUBBORN, str(tmp_path / "sampler"))
    leader = _start(run_id, MEEK, str(tmp_path / "leader"))
    pidfile = tmp_path / "node0.pid"
    pidfile.write_text(str(leader.pid))
    (tmp_path / "node0.pid.sampler").write_text(str(sampler.pid))
    r = _teardown(run_id, pidfiles=[str(pidfile)], grace=600)
    assert r.returncode == 0 and r.stdout.strip() == "mlaunch-teardown: 0 left", r.stdout + r.stderr
    assert sampler.wait(limit(10)) == -9 and leader.wait(limit(10)) == -15
    assert job_pids(run_id) == set()


def test_what_a_killed_process_forked_after_the_last_look_is_killed_too(tmp_path):
    """The KILL ends what one look at /proc found; a process forked between that look and the
    kill outlived it (a node torn down 18 ms after its start kept a sampler loop that held
    the session's output open, and the attempt never ended). Kills repeat until a look finds
    nothing: a killed process forks no more."""
    run_id = own_name("td-")
    spawner = _start(run_id, SPAWNER, str(tmp_path / "spawner"))
    r = _teardown(run_id, pidfiles=[], grace=0.3)
    assert r.returncode == 0 and r.stdout.strip() == "mlaunch-teardown: 0 left", r.stdout + r.stderr
    assert spawner.wait(limit(10)) == -9
    assert job_pids(run_id) == set()


def test_the_clock_reads_proc_uptime_in_hundredths():
    script = render.teardown_script("MLAUNCH_RUN_ID=none", pidfiles=[], grace=0)
    clock = script[script.index("now() {"):].split("\n", 1)[0]
    r = subprocess.run(["/bin/sh", "-c", f"{clock}\nnow"], capture_output=True, text=True, check=True)
    up = float(open("/proc/uptime").read().split()[0])
    assert abs(int(r.stdout) / 100 - up) < 60   # the same clock, read a moment apart


def test_exec_ends_its_commands_group_when_the_session_closes():
    """`mlaunch exec`'s hang-up guard (templates/exec.sh.j2): stdin closes, the command's
    process group gets SIGTERM. dash's kill takes a negative pid after `--` only with -s
    (`kill -TERM -- -PID` is "Illegal number" there): such a guard would leave the command
    running for its 600 s, past the test's timeout."""
    run_id = own_name("ex-")
    script = render.exec_script(0, "h", ["sleep 600 & sleep 600; wait"], [("MLAUNCH_RUN_ID", run_id)],
                                None, None)
    proc = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.PIPE)
    deadline = time.monotonic() + limit(30)
    while len(job_pids(run_id)) < 3:   # the command's shell and its two sleeps
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.stdin.close()
    assert proc.wait(limit(60)) == 128 + 15
    deadline = time.monotonic() + limit(30)
    while job_pids(run_id):
        assert time.monotonic() < deadline, job_pids(run_id)
        time.sleep(0.05)

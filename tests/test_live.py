"""The live per-node view: samples over the open sessions, live.json, `ps RUN`, the terminal."""
from __future__ import annotations

import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from launcher.view import nodeview
from launcher import render
from launcher.logs.stream import Printer
from launcher.record.events import read_events

from .helpers import ROOT, limit, mlaunch, python_with_smi, script_job, write_spec
from .test_fanout import job_pids

DATA = os.path.join(ROOT, "tests", "data")
ROWS = os.path.join(DATA, "nvidia-smi-h200.csv")        # recorded on an H200 while training
HEADER = os.path.join(DATA, "nvidia-smi-h200-header.csv")


def recorded_rows() -> list[nodeview.Gpu]:
    with open(ROWS, encoding="utf-8") as f:
        return [nodeview.parse_gpu(line) for line in f if line.strip()]


# ---- the pieces, without hosts ----

def test_recorded_nvidia_smi_rows_parse():
    rows = recorded_rows()
    assert len(rows) >= 20 and all(r is not None for r in rows)
    with open(HEADER, encoding="utf-8") as f:
        header, first = f.read().splitlines()[:2]
    assert header.startswith("index, utilization.gpu [%], memory.used [MiB], memory.total [MiB]")
    total = int(first.split(",")[3].split()[0])
    assert {r.total_mib for r in rows} == {total}
    assert all(0 <= r.util <= 100 and 0 <= r.used_mib <= r.total_mib for r in rows)
    # It was recorded while a job trained: busy rows with most of the memory in use exist.
    assert max(r.util for r in rows) >= 50 and max(r.used_mib for r in rows) > total // 10


def test_split_takes_samples_out_even_inside_a_line():
    plain = ["a", "b"]
    kept, samples = nodeview.split(plain)
    assert kept is plain and samples == []
    kept, samples = nodeview.split(["step 3", "50%|#####\x1emlaunch-gpu 0, 87, 64783, 143771",
                                    "\x1emlaunch-cpu 10 90 1000 400"])
    assert kept == ["step 3", "50%|#####"]
    assert samples == ["gpu 0, 87, 64783, 143771", "cpu 10 90 1000 400"]
    assert nodeview.parse_gpu("0, [N/A], 1, 2") is None and nodeview.parse_gpu("garbage") is None


def test_cpu_use_is_the_share_of_busy_jiffies_between_two_samples():
    node = nodeview.NodeState(0, "h")
    node.sample("cpu 100 900 8388608 6291456", 1.0)
    assert node.cpu.util is None and node.cpu.total_mib == 8192 and node.cpu.used_mib == 2048
    node.sample("cpu 400 1600 8388608 4194304", 2.0)
    assert node.cpu.util == pytest.approx(30.0) and node.cpu.used_mib == 4096
    assert node.figures() == {"cpu": {"util": 30.0, "mem_used_mib": 4096, "mem_total_mib": 8192}}


def test_one_sample_event_a_minute_per_node():
    now = [0.0]
    view = nodeview.LiveView("r", [(0, "a"), (1, "b")], clock=lambda: now[0])
    assert view.due_events() == []                       # nothing sampled yet
    view.output(0, ["gpu 0, 87, 64783, 143771"])
    assert [e["node"] for e in view.due_events()] == [0]
    now[0] = 30.0
    view.output(1, ["cpu 1 1 1024 512"])
    view.output(0, ["gpu 0, 90, 64783, 143771"])
    assert [e["node"] for e in view.due_events()] == [1]  # node 0 had its event 30 s ago
    now[0] = 61.0
    events = view.due_events()
    assert [e["node"] for e in events] == [0]
    assert events[0]["gpus"] == [{"index": 0, "util": 90, "mem_used_mib": 64783, "mem_total_mib": 143771}]


def test_status_lines_fit_the_terminal_and_name_every_node():
    view = nodeview.LiveView("run1", [(0, "10.0.0.2"), (1, "a-much-longer-host-name")])
    for row in recorded_rows()[:8]:
        view.output(0, [f"gpu {row.index}, {row.util}, {row.used_mib}, {row.total_mib}"])
    view.lines_seen(0)
    view.steps((12, 40), {0: (12, 40)})
    view.ended(1, "exit 0")
    lines = view.status_lines(120)
    assert lines[0] == "run run1: 2 nodes, step 12/40"
    assert re.match(r"node0\s+10\.0\.0\.2\s+running\s+step 12/40\s+out\s+0s\s+gpu0\s+\d+%", lines[1])
    assert re.match(r"node1\s+a-much-longer-host-name\s+exit 0\s+step -", lines[2])
    assert all(len(line) <= 80 for line in view.status_lines(40))


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_printer_redraws_the_status_block_in_place(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("MLAUNCH_LIVE", raising=False)
    out, figures = _Tty(), ["first"]
    printer = Printer(lambda s: s, out, color=False)
    printer.set_status(lambda width: ["status " + figures[0], "line two"])
    printer.node_lines(0, "h", ["hello"])
    figures[0] = "second"
    printer.say("note")
    printer.set_status(None)
    text = out.getvalue()
    # hello, then the block; the block erased (2 lines up, clear) before "note", drawn again,
    # and erased for good at the end.
    assert text == ("[node0 h] hello\n\x1b[2mstatus first\x1b[0m\n\x1b[2mline two\x1b[0m\n"
                    "\x1b[2F\x1b[J[mlaunch] note\n\x1b[2mstatus second\x1b[0m\n\x1b[2mline two\x1b[0m\n"
                    "\x1b[2F\x1b[J")


def test_no_status_lines_off_a_terminal():
    out = io.StringIO()
    printer = Printer(lambda s: s, out, color=False)
    printer.set_status(lambda width: ["status"])
    printer.node_lines(0, "h", ["hello"])
    printer.redraw()
    assert out.getvalue() == "[node0 h] hello\n"


def test_sampler_is_rendered_only_when_asked_and_not_under_slurm():
    from launcher.plan.launch_plan import _sampler
    from launcher.spec import validate as load_job
    spec = script_job(["h1", "h2"], 1, "steps.py", [], "/tmp/out")
    job = load_job(spec)
    assert "-lms 2000" in _sampler(job, "r") and "mlaunch-cpu" in _sampler(job, "r")
    spec["health"] = {"sample_every_s": 0}
    assert _sampler(load_job(spec), "r") is None
    spec["health"] = {"sample_every_s": 0.25}
    assert "-lms 250" in render.sampler_script("r", 0.25)


# ---- on namespace hosts ----

def fake_gpu_bin(tmp_path) -> str:
    """A bin directory (cluster.python's) whose nvidia-smi replays the H200 recording."""
    return python_with_smi(tmp_path, "fake_nvidia_smi.sh")


def steps_job(hs, tmp_path, name: str, steps: int, interval: float, every: float) -> tuple[str, str]:
    out = str(tmp_path / name)
    spec = script_job([h.ip for h in hs.hosts], 1, "steps.py", [str(steps), str(interval)], out,
                      hs=hs, python=fake_gpu_bin(tmp_path / name) if every else sys.executable,
                      env={"FAKE_NVIDIA_SMI_ROWS": ROWS, "FAKE_NVIDIA_SMI_NO_DRIVER": "1"})
    spec["health"] = {"sample_every_s": every}
    return write_spec(tmp_path, spec, f"{name}.yaml"), out


def sessions(host) -> int:
    """SSH sessions this host's sshd has started (LogLevel VERBOSE logs each one)."""
    with open(host.sshd_log, errors="replace") as f:
        return f.read().count("Starting session:")


def settled_sessions(hosts) -> list[int]:
    """sessions() once every connection to each host has ended: an sshd session process writes
    its "Starting session" line before it exits, so with none of sshd's children left the log
    holds every session so far. (Waiting for two equal counts 0.25 s apart was not enough
    under load: a session of a finished run was logged after that.)"""
    deadline = time.monotonic() + limit(60)
    while any(_sshd_children(h.sshd_pid) for h in hosts):
        assert time.monotonic() < deadline, {h.name: _sshd_children(h.sshd_pid) for h in hosts}
        time.sleep(0.1)
    return [sessions(h) for h in hosts]


def _sshd_children(sshd_pid: int) -> list[int]:
    """The processes whose parent is this sshd (one per connection being served)."""
    kids = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == sshd_pid:
            kids.append(int(d))
    return kids


@pytest.mark.multihost
def test_samples_ride_the_open_sessions(make_hostset, tmp_path):
    with make_hostset(2) as hs:
        (tmp_path / "off").mkdir()
        (tmp_path / "on").mkdir()
        base = settled_sessions(hs.hosts)
        spec, _ = steps_job(hs, tmp_path, "off", 3, 0.3, 0)
        r = mlaunch("submit", "--no-preflight", spec, timeout=120)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr
        mid = settled_sessions(hs.hosts)
        spec, out = steps_job(hs, tmp_path, "on", 24, 0.4, 0.25)
        r = mlaunch("submit", "--no-preflight", spec, timeout=120)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr
        end = settled_sessions(hs.hosts)
        snap = json.load(open(glob.glob(f"{out}/logs/*/live.json")[0]))
        gpu_node, cpu_node = snap["nodes"]
        # ~10 s of sampling every 0.25 s: dozens of samples, and not one more session per host
        # than the same job without sampling.
        assert gpu_node["samples"] >= 10 and cpu_node["samples"] >= 10
        assert [e - m for e, m in zip(end, mid)] == [m - b for m, b in zip(mid, base)]
        assert nodeview.Gpu(**_gpu(gpu_node["gpus"][0])) in recorded_rows()
        assert "gpus" not in cpu_node and cpu_node["cpu"]["mem_total_mib"] > 0
        assert snap["step"] == 24 and gpu_node["step"] == 24 and gpu_node["state"] == "exit 0"
        assert cpu_node["state"] == "exit 0" and cpu_node["step"] is None
        samples = [e for e in read_events(glob.glob(f"{out}/logs/*/events.jsonl")[0])
                   if e["event"] == "gpu_sample"]
        assert sorted(e["node"] for e in samples) == [0, 1]
        # The samples are not the job's output: not in its logs, not on a non-terminal stdout.
        for path in glob.glob(f"{out}/logs/*/node*.log"):
            assert "mlaunch-" not in open(path).read()
        assert "\x1e" not in r.stdout and "mlaunch-gpu" not in r.stdout
        assert not re.search(r"^(run t-|node\d)", r.stdout, re.M)
        for h in hs.hosts:
            assert job_pids(h, set()) == set()
        # `mlaunch ps RUN` shows each node's last sample.
        run_id = os.path.basename(glob.glob(f"{out}/logs/*")[0])
        ps = mlaunch("ps", run_id)
        assert ps.returncode == 0, ps.stderr
        assert re.search(rf"node0\s+{re.escape(hs.hosts[0].ip)}\s+exit 0\s+step 24/24.*gpu0\s+\d+%", ps.stdout)
        assert re.search(rf"node1\s+{re.escape(hs.hosts[1].ip)}\s+exit 0.*cpu\s+\d+% mem", ps.stdout)


def _gpu(d: dict) -> dict:
    return {"index": d["index"], "util": d["util"], "used_mib": d["mem_used_mib"],
            "total_mib": d["mem_total_mib"]}


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.multihost
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (run-tests.sh installs it)")
def test_live_view_in_a_terminal(make_hostset, tmp_path):
    with make_hostset(2) as hs:
        spec, _ = steps_job(hs, tmp_path, "tty", 30, 0.5, 0.5)
        session = f"mlaunch-live-{os.getpid()}"
        cmd = (f"cd {ROOT} && TERM=xterm {sys.executable} -m launcher.cli submit --no-preflight {spec}; "
               "echo MLAUNCH-EXIT=$?; sleep 600")
        _tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "40", cmd)
        try:
            screens, steps, deadline = [], set(), time.monotonic() + limit(120)
            node0 = re.compile(rf"^node0\s+{re.escape(hs.hosts[0].ip)}\s+running\s+step (\d+)/30"
                               r"\s+out\s+\d+s\s+gpu0\s+\d+%\s+[\d.]+/\d+G", re.M)
            while time.monotonic() < deadline:
                screen = _tmux("capture-pane", "-p", "-t", session, "-S", "-")
                if "MLAUNCH-EXIT=" in screen:
                    break
                if (m := node0.search(screen)):
                    steps.add(int(m.group(1)))
                    screens.append(screen)
                time.sleep(0.7)
            final = _tmux("capture-pane", "-p", "-t", session, "-S", "-")
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        assert "MLAUNCH-EXIT=0" in final, final[-2000:]
        assert len(steps) >= 3, steps                 # the line updated as the run went on
        for screen in screens:
            # Drawn in place: one block in the whole history, at the bottom, under the stream.
            assert len(node0.findall(screen)) == 1
            lines = screen.rstrip("\n").split("\n")
            while lines and not lines[-1].strip():
                lines.pop()
            assert re.match(rf"node1\s+{re.escape(hs.hosts[1].ip)}\s+\S+.*cpu\s+(\d+|-)% mem", lines[-1])
            assert node0.match(lines[-2]) and lines[-3].startswith("run t-")
        assert not node0.search(final)                # erased when the run ended
        assert re.search(r"\[node0 [\d.]+ local0\] \{'loss'", final)
        # The console log (`mlaunch logs`) has the stream and not the status lines.
        run_id = re.search(r"job (t-[\w-]+) succeeded", final).group(1)
        console = mlaunch("logs", run_id).stdout
        assert "global_step/max_steps': '30/30'" in console
        assert not re.search(r"^(run t-|node\d)", console, re.M) and "\x1b[2F" not in console


@pytest.mark.multihost
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (run-tests.sh installs it)")
def test_attach_shows_the_detached_runs_status_lines(make_hostset, tmp_path):
    from .runs import Runs
    runs = Runs(str(tmp_path / "home"))
    with make_hostset(2) as hs:
        spec, _ = steps_job(hs, tmp_path, "att", 40, 0.5, 0.5)
        r = runs.cli("submit", "-d", "--no-preflight", spec)
        assert r.returncode == 0, r.stdout + r.stderr
        run_id = re.search(r"(t-\d{8}-\d{6}-\w+)", r.stdout + r.stderr).group(1)
        session = f"mlaunch-attach-{os.getpid()}"
        cmd = (f"cd {ROOT} && TERM=xterm MLAUNCH_HOME={runs.env['MLAUNCH_HOME']} "
               f"{sys.executable} -m launcher.cli attach {run_id}; echo MLAUNCH-EXIT=$?; sleep 600")
        _tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "40", cmd)
        node0 = re.compile(rf"^node0\s+{re.escape(hs.hosts[0].ip)}\s+running\s+step (\d+)/40"
                           r".*gpu0\s+\d+%", re.M)
        try:
            steps, deadline = set(), time.monotonic() + limit(120)
            while time.monotonic() < deadline:
                screen = _tmux("capture-pane", "-p", "-t", session, "-S", "-")
                if "MLAUNCH-EXIT=" in screen:
                    break
                steps.update(int(m) for m in node0.findall(screen))
                assert len(node0.findall(screen)) <= 1
                time.sleep(0.7)
            final = _tmux("capture-pane", "-p", "-t", session, "-S", "-")
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        # attach follows the run to its end and exits with its code; the block went with it.
        assert "MLAUNCH-EXIT=0" in final, final[-2000:]
        assert len(steps) >= 3, steps
        assert not node0.search(final) and "global_step/max_steps': '40/40'" in final

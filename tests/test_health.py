"""Run health: step detection, the hang watchdog with stack dumps, NaN stop, world-size check,
and the events.jsonl log, on recorded trainer output and on real runs."""
from __future__ import annotations

import os
import re
import signal
import time

import pytest

from launcher.watch import stacks
from launcher.record.events import read_events
from launcher.watch.health import HealthConfig, Monitor, read_step, read_world_size

from .helpers import ROOT, limit, mlaunch, script_job, write_spec
from .procs import job_pids_left, own_name
from .test_fanout import job_pids

DATA = os.path.join(ROOT, "tests", "data")


def _lines(name: str) -> list[str]:
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return [re.sub(r"^\[node\d+ \S+ local\d+\] ", "", line.rstrip("\n")) for line in f]


def test_steps_of_a_recorded_llamafactory_run():
    """The quickstart's real output (2 ranks, max_steps 8, logging_steps 1)."""
    steps = [s for s in map(read_step, _lines("lf-quickstart-run.log")) if s is not None]
    logged = [s.loss for s in steps if s.loss is not None]
    assert logged[:2] == [5.99, 5.9574] and len(logged) == 8
    assert max(s.step for s in steps if s.step is not None) == 8
    assert [read_world_size(x) for x in _lines("lf-quickstart-run.log") if "world size" in x] == [2, 2]


def test_steps_of_recorded_swift_lines():
    """ms-swift's logging dict carries the step as 'global_step/max_steps'."""
    path = os.path.join(DATA, "swift-run.log")
    if not os.path.exists(path):
        pytest.skip("no recorded ms-swift output")
    steps = [s for s in map(read_step, _lines("swift-run.log")) if s is not None and s.loss is not None]
    assert [s.step for s in steps] == [1, 2, 3, 4, 5, 6] and steps[0].loss == 5.974
    assert all(s.total == 6 for s in steps)
    assert [read_world_size(x) for x in _lines("swift-run.log") if "world_size" in x][:1] == [4]


def test_nan_written_by_python_repr_is_read():
    step = read_step("{'step': 5, 'loss': nan, 'grad_norm': inf}")
    assert step.step == 5 and step.loss != step.loss and step.grad_norm == float("inf")


def test_a_line_torchrun_copied_in_two_pieces_reads_as_the_line():
    """torchrun's --tee copies a line the rank is still writing in two pieces, each behind its
    header (tests/test_relay.py's 40,000-line job): print()'s text and its "\\n" apart, or a
    write cut at a page. The watch reads the line the rank wrote: its loss and grad_norm, its
    bar's step, its world size; a line of another rank's header inside is left as it is."""
    m = Monitor(HealthConfig(), expected_world=2, clock=Clock())
    whole = "{'loss': 1.25, 'grad_norm': 0.5, 'learning_rate': 0.001, 'epoch': 0.5}"
    split = ["[default0]:" + whole + "[default0]:",                      # its "\n" written apart
             "[default0]:" + whole[:20] + "[default0]:" + whole[20:],     # cut in its middle
             "[default1]:" + whole]
    steps = [v.fields for v in m.lines(0, "h", split) if v.event == "step"]
    assert [(f["loss"], f["grad_norm"]) for f in steps] == [(1.25, 0.5)] * 3
    bar = "[default0]:  3%|#  | 3/1[default0]:00 [00:01<00:30]"
    assert read_step(bar) is None   # the pieces as they stand: no step...
    m.lines(0, "h", [bar])          # ...the watch reads the line whole
    assert m.node_steps[0] == (3, 100)
    other = "[default0]:{'loss': 2.0[default1]:, 'epoch': 0.5}"
    assert not [v for v in m.lines(0, "h", [other]) if v.event == "step"]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _monitor(**kw) -> tuple[Monitor, Clock]:
    clock = Clock()
    return Monitor(HealthConfig(**kw), expected_world=4, clock=clock), clock


def test_hang_limit_follows_the_step_time_and_startup_has_its_own():
    m, c = _monitor(min_hang_s=60, hang_step_factor=20, startup_after_s=300)
    c.t = 299
    assert m.tick() == []
    for step in range(1, 6):          # a step every 10 s: limit max(60, 20 x 10) = 200
        c.t += 10
        m.lines(0, "h", [f"{{'step': {step}, 'loss': 1.0}}"])
    assert m.hang_limit() == 200
    c.t += 199
    assert m.tick() == []
    c.t += 2
    (v,) = m.tick()
    assert v.event == "hang" and v.stop and v.restartable and v.fields["last_step"] == 5
    assert "after step 5" in v.message and m.tick() == []   # once


def test_startup_limit_fires_before_the_first_step():
    m, c = _monitor(startup_after_s=100)
    m.lines(0, "h", ["  0%|          | 0/8 [00:00<?, ?it/s]"])   # the bar before step 1
    c.t = 101
    (v,) = m.tick()
    assert v.fields["phase"] == "startup" and "before the first step" in v.message


def test_nan_patience_names_the_first_bad_step():
    m, _ = _monitor(nan_patience=3)
    verdicts = []
    for step, loss in [(4, "1.0"), (5, "nan"), (6, "nan"), (7, "nan")]:
        verdicts += m.lines(0, "h", [f"{{'step': {step}, 'loss': {loss}}}"])
    stop = [v for v in verdicts if v.stop]
    assert len(stop) == 1 and stop[0].event == "nan" and not stop[0].restartable
    assert "at step 5" in stop[0].message and stop[0].fields["last_step"] == 7


def test_nan_streak_broken_by_a_good_loss_does_not_stop():
    m, _ = _monitor(nan_patience=2)
    out = []
    for step, loss in [(1, "nan"), (2, "1.0"), (3, "nan"), (4, "1.0")]:
        out += m.lines(0, "h", [f"{{'step': {step}, 'loss': {loss}}}"])
    assert not any(v.stop for v in out)


def test_zero_loss_is_off_by_default_and_stops_when_asked():
    lines = [f"{{'step': {i}, 'loss': 0.0}}" for i in range(1, 6)]
    m, _ = _monitor()
    assert not any(v.stop for v in m.lines(0, "h", lines))
    m, _ = _monitor(zero_loss_patience=3)
    assert any(v.stop and "exactly 0.0" in v.message for v in m.lines(0, "h", lines))


def test_world_size_mismatch_names_the_node():
    m, _ = _monitor()
    assert m.lines(0, "a", ["Process rank: 0, world size: 4, device: cpu"]) == []
    (first,) = m.lines(1, "10.0.0.2", ["Process rank: 2, world size: 2, device: cpu"])
    assert first.event == "world_size_suspect" and not first.stop
    (v,) = m.lines(1, "10.0.0.2", ["Process rank: 3, world size: 2, device: cpu"])
    assert v.event == "world_size_mismatch" and v.stop and v.fields["lines"] == 2
    assert "node1 10.0.0.2 joined a world of 2, the plan has 4 (2 lines agree" in v.message


def test_one_wrong_line_is_recorded_but_does_not_stop():
    """The second source: one line (even repeated) is a suspicion, not a verdict."""
    m, _ = _monitor()
    out = m.lines(1, "h", ["[default0]:rank 2: world_size=3"] * 3)
    assert [v.event for v in out] == ["world_size_suspect"] and not out[0].stop


def _torchrun(name: str) -> list[str]:
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


@pytest.mark.parametrize("name, world", [("torchrun-2.13-info-1x2.log", 2),
                                         ("torchrun-2.13-info-2x2-node0.log", 4),
                                         ("torchrun-2.13-info-2x2-node1.log", 4)])
def test_recorded_torchrun_info_output_states_the_real_world(name, world):
    """torchrun 2.13 at LOGLEVEL=INFO, TORCH_DISTRIBUTED_DEBUG=DETAIL (gloo, tests/data/):
    group_world_size (the node count) and role_world_sizes are never read as the world."""
    lines = _torchrun(name)
    assert any(re.search(r"\bgroup_world_size=", x) for x in lines)
    worlds = [(x, read_world_size(x)) for x in lines if read_world_size(x) is not None]
    assert worlds and {w for _, w in worlds} == {world}
    assert all("group_world_size" not in x and "role_world_sizes" not in x for x, _ in worlds)
    assert any("global_world_sizes=" in x for x, _ in worlds)


def test_recorded_2x2_info_run_passes_the_check():
    """The issue's case: 2 nodes x 2 ranks, torchrun at INFO; the plan's world is 4."""
    m, _ = _monitor()
    verdicts = (m.lines(0, "a", _torchrun("torchrun-2.13-info-2x2-node0.log"))
                + m.lines(1, "b", _torchrun("torchrun-2.13-info-2x2-node1.log")))
    assert not [v for v in verdicts if v.event.startswith("world_size")]


def test_recorded_2x2_info_run_with_a_smaller_plan_is_caught():
    """The same recorded lines against a plan of 2 processes: the real world differs."""
    m = Monitor(HealthConfig(), expected_world=2, clock=Clock())
    verdicts = m.lines(1, "b", _torchrun("torchrun-2.13-info-2x2-node1.log"))
    stops = [v for v in verdicts if v.stop]
    assert [v.event for v in stops] == ["world_size_mismatch"]
    assert "joined a world of 4, the plan has 2" in stops[0].message


@pytest.mark.parametrize("line", [
    "I1202 01:14:02.802000 13755 site-packages/torch/distributed/elastic/agent/server/api.py:553]   group_world_size=2",
    "I1202 01:14:02.802000 13755 site-packages/torch/distributed/elastic/agent/server/api.py:553]   role_world_sizes=[4, 4]",
    "[default0]:[INFO:swift] local_world_size: 2",
    "[default0]:local_world_size=2",
    "[default0]:step 3 group_world_size=2 world_size=7",
    "print world size: 8 of something else",
])
def test_lines_that_are_not_the_jobs_world(line):
    assert read_world_size(line) is None


def test_checkpoint_event_once_training_moved_past_the_save():
    m, _ = _monitor()
    out = m.lines(0, "h", ["{'step': 5, 'loss': 1.0}",
                           "[INFO|trainer.py:4309] >> Saving model checkpoint to /o/checkpoint-5"])
    assert not [v for v in out if v.event == "checkpoint"]
    out = m.lines(0, "h", ["{'step': 6, 'loss': 1.0}"])
    assert [v.fields["path"] for v in out if v.event == "checkpoint"] == ["/o/checkpoint-5"]


def test_stack_summary_of_a_recorded_pyspy_dump():
    """Real `py-spy dump --native` output of a 2-rank gloo job whose rank 1 slept."""
    found = stacks.split_dump(open(os.path.join(DATA, "pyspy-allreduce-hang.txt")).read())
    assert [s.rank for s in found] == [0, 1]
    assert found[0].top == "all_reduce (distributed_c10d.py)"
    assert stacks.summary(found) == ("rank 0 in all_reduce (distributed_c10d.py); "
                                     "rank 1 in <module> (hang.py)")


def test_summary_groups_ranks_into_ranges():
    def rs(rank, frame):
        text = f'Thread 1 (idle): "MainThread"\n    {frame} (x/{frame}.py:1)\n'
        return stacks.RankStack(1, 0, rank, rank, text, True)
    found = [rs(r, "save") for r in (0, 1, 2, 3, 4, 6, 7)] + [rs(5, "all_reduce")]
    assert stacks.summary(found) == "rank 5 in all_reduce (all_reduce.py); ranks 0-4,6-7 in save (save.py)"


STOPPED_ERR = """Error: Failed to get stack traces

Caused by:
    0: Failed to suspend process
    1: unexpected waitpid result PtraceEvent(Pid(7), SIGSTOP, 128) to 7
"""


def _dump(pid, rank, tries, state="S", node=0):
    """Node output as templates/stacks.sh.j2 prints it: header, then (mode, rc, text) tries."""
    rc, mode = tries[-1][1], tries[-1][0]
    body = "".join(f"MLAUNCH-TRY mode={m} rc={c}\n{t}" for m, c, t in tries)
    return f"MLAUNCH-STACK pid={pid} node={node} rank={rank} local={rank} rc={rc} mode={mode} state={state}\n{body}"


def test_a_stopped_rank_is_shown_from_the_nonblocking_read():
    frames = 'Python v3.11.7 (/usr/bin/python3.11)\n\nThread 7 (idle): "MainThread"\n    train (job.py:9)\n'
    out = _dump(7, 1, [("native", 1, STOPPED_ERR), ("plain", 1, STOPPED_ERR), ("nonblocking", 0, frames)], "T")
    out += _dump(6, 0, [("native", 0, frames.replace("train", "all_reduce"))])
    found = stacks.split_dump(out)
    assert [(s.rank, s.mode, s.ok) for s in found] == [(0, "native", True), (1, "nonblocking", True)]
    assert stacks.summary(found) == "rank 0 in all_reduce (job.py); rank 1 in train (job.py), stopped"
    assert stacks.advice(found) == ""


def test_failed_dumps_name_the_real_cause_not_ptrace_scope():
    gone = "Error: Failed to get process executable name. Check that the process is running.\n"
    denied = "Error: Failed to open process\nCaused by:\n    0: Permission denied (os error 13)\n"
    stopped = _dump(7, 1, [("native", 1, STOPPED_ERR), ("nonblocking", 1, "Error: Failed to copy\n")], "T")
    found = stacks.split_dump(stopped + _dump(8, 2, [("native", 1, gone), ("nonblocking", 1, gone)], ""))
    assert stacks.summary(found) == (
        "rank 1 in no stack (the process is stopped (SIGSTOP or a debugger) and the non-blocking "
        "read failed too), stopped; rank 2 in no stack (the process exited before py-spy read it)")
    assert not stacks.denied(found) and stacks.advice(found) == ""
    refused = stacks.split_dump(_dump(9, 0, [("native", 1, denied), ("nonblocking", 1, denied)]))
    assert stacks.denied(refused) and "ptrace_scope=0" in stacks.advice(refused)
    missing = stacks.split_dump(_dump(9, 0, [("native", 127, "timeout: failed to run command 'py-spy': "
                                                         "No such file or directory\n")]))
    assert "pip install py-spy" in stacks.advice(missing)


def test_each_rank_is_listed_once():
    """An in-process rank's helpers (`timeout`, `head` of the hang-up guard) carry its
    MLAUNCH_IN_PROCESS=1: their failed dumps must not list rank 0 three times."""
    not_py = "Error: Failed to find python version from target process\n"
    frames = 'Python v3.12.3 (/usr/bin/python3)\n\nThread 5 (idle): "MainThread"\n    step (trainer.py:1)\n'
    out = (_dump(3, 0, [("native", 1, not_py), ("nonblocking", 1, not_py)])
           + _dump(5, 0, [("native", 1, STOPPED_ERR), ("nonblocking", 0, frames)], "T")
           + _dump(9, 0, [("native", 1, not_py), ("nonblocking", 1, not_py)]))
    found = stacks.split_dump(out)
    assert [(s.pid, s.rank) for s in found] == [(5, 0)]
    assert stacks.summary(found) == "rank 0 in step (trainer.py), stopped"


@pytest.mark.launches
def test_stopped_rank_of_a_local_script_job_is_dumped_and_listed_once(tmp_path):
    """2 local processes; rank 1 SIGSTOPs itself before step 4: the hang report shows its
    stack (py-spy's non-blocking read) beside rank 0's all_reduce, each rank once."""
    import shutil
    if not shutil.which("py-spy"):
        pytest.skip("py-spy is not installed")
    out = str(tmp_path / "out")
    spec = script_job(["localhost"], 2, "health_job.py",
                      ["--steps", "30", "--stop-rank", "1", "--stop-step", "4"], out)
    spec["name"] = name = own_name("stopstack")
    spec["health"] = {"hang_after_s": 10}
    r = mlaunch("submit", write_spec(tmp_path, spec), "--no-preflight", timeout=240)
    assert r.returncode == 124, r.stdout[-3000:]
    summary = re.search(r"^\[mlaunch\] hang: (.*)$", r.stdout, re.M).group(1)
    assert summary == "rank 0 in all_reduce (distributed_c10d.py); rank 1 in <module> (health_job.py), stopped"
    assert "ptrace_scope" not in summary
    (run,) = os.listdir(os.path.join(out, "logs"))
    sdir = os.path.join(out, "logs", run, "stacks", "attempt0")
    assert sorted(os.listdir(sdir)) == ["node0-rank0.txt", "node0-rank1.txt"]
    stopped = open(os.path.join(sdir, "node0-rank1.txt")).read()
    assert "MLAUNCH-TRY mode=nonblocking rc=0" in stopped and "<module> (" in stopped, stopped
    ev = next(e for e in _events(out) if e["event"] == "stacks")
    assert ev["ranks"] == 2
    from .procs import job_pids as local_pids
    assert not local_pids(name + "-")


@pytest.mark.launches
def test_teardown_folds_torchruns_signal_tracebacks_into_its_one_line(tmp_path):
    """A hang torn down by mlaunch: torchrun's SignalException tracebacks on the SIGTERM are
    in the node log, complete, and not on the console, whose teardown line says so."""
    out = str(tmp_path / "out")
    spec = script_job(["localhost"], 2, "health_job.py",
                      ["--steps", "30", "--hang-rank", "1", "--hang-step", "4"], out)
    spec["name"] = name = own_name("foldnoise")
    spec["health"] = {"hang_after_s": 10, "stack_dumps": False}
    r = mlaunch("submit", write_spec(tmp_path, spec), "--no-preflight", timeout=240)
    assert r.returncode == 124, r.stdout[-3000:]
    node_lines = "\n".join(x for x in (r.stdout + r.stderr).splitlines() if not x.startswith("[mlaunch]"))
    assert "SignalException" not in node_lines and "Traceback" not in node_lines, r.stdout[-3000:]
    assert re.search(r"^\[mlaunch\] tearing down the job on every host; torchrun's SignalException "
                     r"tracebacks on it: node logs only$", r.stdout, re.M), r.stdout[-2000:]
    (run,) = os.listdir(os.path.join(out, "logs"))
    (log,) = [f for f in os.listdir(os.path.join(out, "logs", run)) if f.startswith("node0-")]
    text = open(os.path.join(out, "logs", run, log)).read()
    # torchrun's own shutdown lines are kept. Its SignalException chain (a traceback, its
    # SignalException line, "During handling ...", a second traceback and line) comes after its
    # ranks are gone, when the teardown gives it a short drain and then SIGKILL (a teardown ends
    # in ~2 s whatever is left to say): quiet, it is always written whole; loaded, the SIGKILL
    # can come before any of it (loaded run e) or in the middle of it (loaded run h: the first
    # traceback and line only). So the node log must hold what torchrun wrote: a beginning of
    # the chain, in order, nothing of it dropped or shuffled. A second SIGTERM inside torchrun's
    # logging call adds one traceback per "--- Logging error ---" block; where that block is the
    # death-signal warning's own, logging writes its message and arguments instead of the line.
    assert "Received 15 death signal, shutting down workers" in text or (
        "Message: 'Received %s death signal, shutting down workers'\nArguments: (<Signals.SIGTERM: 15>,)"
        in text and "--- Logging error ---" in text), text[-3000:]
    marks = sorted([(m.start(), "s") for m in re.finditer(
        r"^torch\.distributed\.elastic\.multiprocessing\.api\.SignalException: Process \d+ got "
        r"signal: 15$", text, re.M)] + [(m.start(), "d") for m in re.finditer(
            "During handling of the above exception, another exception occurred:", text)])
    order = "".join(kind for _, kind in marks)
    # "d" and "ds": a loaded CI run (2026-12-07) had the chain's first exception end in a line
    # other than SignalException's whole line; what follows it was there, in order.
    assert order in ("", "s", "sd", "sds", "d", "ds"), (order, text[-3000:])
    begun = text.count("Traceback (most recent call last):") - text.count("--- Logging error ---")
    assert 0 <= begun - order.count("s") <= 1, (begun, order, text[-3000:])   # one may be cut short
    from .procs import job_pids as local_pids
    assert not local_pids(name + "-")


# --- real runs on the namespace hosts ---------------------------------------------------

def _health_job(hs, out, args, **health):
    spec = script_job([h.ip for h in hs.hosts], 2, "health_job.py", args, out, hs=hs)
    spec["health"] = health
    return spec


def _events(out: str) -> list[dict]:
    (run,) = os.listdir(os.path.join(out, "logs"))
    return read_events(os.path.join(out, "logs", run, "events.jsonl"))


@pytest.mark.multihost
def test_hang_dumps_every_rank_and_tears_down(make_hostset, tmp_path):
    with make_hostset(2) as hs:
        out = str(tmp_path / "out")
        spec = _health_job(hs, out, ["--steps", "30", "--hang-rank", "3", "--hang-step", "4"],
                           hang_after_s=10)
        r = mlaunch("submit", write_spec(tmp_path, spec), timeout=240)
        left = [job_pids(h, set()) for h in hs.hosts]
    assert r.returncode == 124, r.stdout[-3000:]
    assert left == [set(), set()]
    summary = re.search(r"^\[mlaunch\] hang: (.*)$", r.stdout, re.M).group(1)
    assert summary.startswith("rank 3 in <module> (health_job.py); ranks 0-2 in all_reduce ("), summary
    (run,) = os.listdir(os.path.join(out, "logs"))
    sdir = os.path.join(out, "logs", run, "stacks", "attempt0")
    files = sorted(os.listdir(sdir))
    assert files == ["node0-rank0.txt", "node0-rank1.txt", "node1-rank2.txt", "node1-rank3.txt"]
    for name in files[:3]:
        assert "all_reduce" in open(os.path.join(sdir, name)).read(), name
    ev = _events(out)
    names = [e["event"] for e in ev]
    assert names.index("first_step") < names.index("hang") < names.index("stacks") < names.index("teardown")
    last_step = max(time_of(e) for e in ev if e["event"] == "step" or e["event"] == "first_step")
    # The bound, hang_after_s + 15 s, plus 15 s for py-spy, stretched as every wait of
    # the suite is on a loaded machine (loadfactor.limit).
    assert time_of(next(e for e in ev if e["event"] == "teardown")) - last_step <= limit(10 + 15 + 15)


def time_of(event: dict) -> float:
    import calendar
    stamp, ms = event["time"].rstrip("Z").split(".")
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")) + int(ms) / 1000


@pytest.mark.multihost
def test_nan_loss_stops_the_run_and_names_the_step(make_hostset, tmp_path):
    with make_hostset(2) as hs:
        out = str(tmp_path / "out")
        spec = _health_job(hs, out, ["--steps", "40", "--nan-step", "5"])
        spec["max_restarts"] = 2   # a NaN would come back: no restart
        r = mlaunch("submit", write_spec(tmp_path, spec), timeout=240)
        left = [job_pids(h, set()) for h in hs.hosts]
    assert r.returncode == 65, r.stdout[-3000:]
    assert left == [set(), set()]
    assert re.search(r"health: nan: loss is nan at step 5 \(3 logs in a row, up to step 7\)", r.stdout)
    assert "restart 1/" not in r.stdout
    nan = [e for e in _events(out) if e["event"] == "nan"]
    assert nan and nan[0]["step"] == 5


@pytest.mark.multihost
def test_wrong_world_size_on_one_node_stops_at_once(make_hostset, tmp_path):
    with make_hostset(2) as hs:
        out = str(tmp_path / "out")
        spec = _health_job(hs, out, ["--steps", "200", "--lie-world", "2", "--lie-node", "1"])
        r = mlaunch("submit", write_spec(tmp_path, spec), timeout=240)
        left = [job_pids(h, set()) for h in hs.hosts]
        ip1 = hs.hosts[1].ip
    assert r.returncode == 78, r.stdout[-3000:]
    assert left == [set(), set()]
    assert f"node1 {ip1} joined a world of 2, the plan has 4" in r.stdout
    assert "step': 200" not in r.stdout   # stopped long before the end


INFO_ENV = {"LOGLEVEL": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}


@pytest.mark.multihost
def test_info_logging_job_runs_to_completion_with_the_check_on(make_hostset, tmp_path):
    """Issue 31: torchrun at INFO prints group_world_size=2 (the node count) on 2 nodes x 2."""
    with make_hostset(2) as hs:
        out = str(tmp_path / "out")
        spec = _health_job(hs, out, ["--steps", "4", "--step-s", "0.1"], world_size_check=True)
        spec["cluster"]["env"] = dict(INFO_ENV)
        r = mlaunch("submit", write_spec(tmp_path, spec), timeout=240)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "group_world_size=2" in r.stdout and "global_world_sizes=[4, 4]" in r.stdout
    assert "'step': 4" in r.stdout
    assert not [e for e in _events(out) if e["event"].startswith("world_size")]


@pytest.mark.multihost
def test_wrong_world_is_still_caught_with_torchrun_at_info(make_hostset, tmp_path):
    with make_hostset(2) as hs:
        out = str(tmp_path / "out")
        spec = _health_job(hs, out, ["--steps", "200", "--lie-world", "3", "--lie-node", "1"])
        spec["cluster"]["env"] = dict(INFO_ENV)
        r = mlaunch("submit", write_spec(tmp_path, spec), timeout=240)
        left = [job_pids(h, set()) for h in hs.hosts]
        ip1 = hs.hosts[1].ip
    assert r.returncode == 78, r.stdout[-3000:]
    assert left == [set(), set()]
    assert f"node1 {ip1} joined a world of 3, the plan has 4 (2 lines agree" in r.stdout
    names = [e["event"] for e in _events(out)]
    assert names.index("world_size_suspect") < names.index("world_size_mismatch")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from .training import build_tiny, require_trainer
    require_trainer()
    return build_tiny(str(tmp_path_factory.mktemp("tiny")))


@pytest.mark.training
def test_stopped_rank_is_a_hang_and_the_run_restarts_from_the_checkpoint(tmp_path, tiny):
    """A real LLaMA-Factory run (1 local rank: a stopped rank is a hang at any world size, and
    one rank halves the trainer start-up CPU); the rank is SIGSTOPped once checkpoint-5 exists.
    30 steps, not 10: loaded, the watcher thread woke after steps 6-10 were done (loaded run m),
    and there was nothing left to stop; the stop may land after a later save, so the restart
    resumes from the newest checkpoint it made (checkpoint-5, -10, ...)."""
    from .test_training import assert_trained
    from .training import held_at, lf_spec, local_job_pids, submit_timed, worker_killed
    out, name = str(tmp_path / "out"), own_name("health-stop")
    spec = held_at(lf_spec(tiny, ["localhost"], 1, out, max_steps=30, save_steps=5, max_restarts=1,
                           restart_backoff_s=1, name=name, health={"hang_after_s": 15}), 5, str(tmp_path / "hold"))
    with worker_killed(local_job_pids(name), os.path.join(out, "checkpoint-5", "trainer_state.json"),
                       b"llamafactory.launcher", sig=signal.SIGSTOP, local_rank=0,
                       release=str(tmp_path / "hold")) as stopped:
        r = submit_timed(tmp_path, spec)
    assert stopped, "no worker was stopped"
    assert_trained(r, out, 30)
    assert "health: hang: no training step for" in r.stdout, r.stdout[-3000:]
    m = re.search(rf"restart 1/1: resuming from {re.escape(out)}/checkpoint-(\d+)", r.stdout)
    assert m and int(m.group(1)) % 5 == 0 and 5 <= int(m.group(1)) < 30, r.stdout[-3000:]
    resumed = f"checkpoint-{m.group(1)}"
    assert job_pids_left(f"{name}-", limit(10)) == set()
    ev = _events(out)
    names = [e["event"] for e in ev]
    assert names[0] == "run_start" and names[-1] == "run_end" and ev[-1]["code"] == 0
    assert names.index("first_step") < names.index("hang") < names.index("restart")
    restart = next(e for e in ev if e["event"] == "restart")
    assert restart["reason"] == "hang" and restart["resume_from"] == f"{out}/{resumed}"
    ckpts = [(e["attempt"], os.path.basename(e["path"])) for e in ev if e["event"] == "checkpoint"]
    # A checkpoint event means the trainer moved past the save; the rank may be stopped before
    # attempt 0 logs another step, so its last checkpoint event may be missing, never wrong.
    assert (1, "checkpoint-30") in ckpts
    assert {name for attempt, name in ckpts if attempt == 0} <= {
        f"checkpoint-{k}" for k in range(5, int(m.group(1)) + 1, 5)}
    assert [e["attempt"] for e in ev] == sorted(e["attempt"] for e in ev)
    assert sum(e["event"] == "node_start" for e in ev) == 2


def _seed_job(**changes):
    from launcher.spec import validate
    from .helpers import seed000, set_path
    raw = seed000()
    for path, value in changes.items():
        set_path(raw, path, value)
    return validate(raw)


def test_ddp_timeout_outlasts_the_startup_limit_by_default():
    from launcher.render import ddp_timeout
    assert ddp_timeout(_seed_job()) == 7200
    assert ddp_timeout(_seed_job(**{"health.startup_after_s": 10000})) == 10600
    assert ddp_timeout(_seed_job(**{"training.ddp_timeout": 900})) == 900


def test_an_infinite_ddp_timeout_is_said_once_with_who_guards():
    from launcher.watch.health import timeout_notice
    assert timeout_notice(_seed_job()) is None
    note = timeout_notice(_seed_job(**{"training.ddp_timeout": 180000000}))
    assert note.startswith("note: ddp_timeout is 180000000 s (2083 days)")
    assert "the hang watchdog (health.hang_after_s) is then the only guard" in note
    off = timeout_notice(_seed_job(**{"training.ddp_timeout": 180000000, "health.enabled": False}))
    assert "nothing ends a hung collective" in off


def test_the_stack_dump_uses_a_private_folder_or_none(tmp_path):
    """Never a fixed /tmp/mlaunch-stacks.<pid> (another user's, if they made it first, would let
    them read the dumps and forge what is read back): a stale TMPDIR falls back to a random
    folder in /tmp, removed at the end; where no folder can be made, one line that the summary
    says instead of "no rank process found"."""
    import glob
    import subprocess
    from launcher import render
    script = render.stack_dump_script("MLAUNCH_RUN=no-such-run", "py-spy", native=False, timeout=5)
    before = set(glob.glob("/tmp/mlaunch-stacks.*"))
    env = {"PATH": os.environ["PATH"], "TMPDIR": str(tmp_path / "none")}
    r = subprocess.run(["sh", "-xc", script], capture_output=True, text=True, timeout=60, env=env)
    made = re.findall(r"tmp=(/tmp/mlaunch-stacks\.\w{8})$", r.stderr, re.M)
    assert r.returncode == 0 and r.stdout == "" and len(made) == 1, r.stderr[-2000:]
    assert not os.path.exists(made[0]) and set(glob.glob("/tmp/mlaunch-stacks.*")) == before
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "mktemp").write_text("#!/bin/sh\nexit 1\n")
    (stub / "mktemp").chmod(0o755)
    env["PATH"] = f"{stub}:{env['PATH']}"
    r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and r.stdout == "mlaunch: no stack dump on this host: mktemp -d failed\n", r
    assert set(glob.glob("/tmp/mlaunch-stacks.*")) == before
    assert stacks.refusals([r.stdout, "", r.stdout]) == "2 nodes: no stack dump on this host: mktemp -d failed"

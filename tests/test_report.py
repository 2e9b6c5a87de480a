"""`mlaunch report` on a real tiny LLaMA-Factory run (1 process on this machine, CPU, gloo)
whose rank is SIGKILLed after its first checkpoint and which an automatic restart finishes;
then the report of it, alone and overlaid on a second, uninterrupted run."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from .helpers import ROOT, mlaunch
from .procs import own_name
from .training import (build_tiny, held_at, lf_spec, local_job_pids, losses, require_trainer,
                       submit_timed, trainer_state, worker_killed)

STEPS, SAVE = 120, 60
NAME = own_name("report-restart")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(restarted run's output_dir, uninterrupted run's output_dir)."""
    require_trainer()
    pytest.importorskip("matplotlib")
    base = tmp_path_factory.mktemp("report")
    tiny = build_tiny(str(base / "tiny"))
    out = str(base / "out")
    spec = held_at(lf_spec(tiny, ["localhost"], 1, out, max_steps=STEPS, save_steps=SAVE, max_restarts=1,
                           restart_backoff_s=1, name=NAME), SAVE, str(base / "hold"))
    with worker_killed(local_job_pids(NAME), os.path.join(out, f"checkpoint-{SAVE}", "trainer_state.json"),
                       b"llamafactory.launcher", release=str(base / "hold")) as killed:
        r = submit_timed(base, spec)
    assert r.returncode == 0 and killed, r.stdout[-3000:]
    assert f"restart 1/1: resuming from {out}/checkpoint-{SAVE}" in r.stdout
    plain = str(base / "plain")
    r = submit_timed(base, lf_spec(tiny, ["localhost"], 1, plain, max_steps=10, save_steps=10, name="report-plain"))
    assert r.returncode == 0, r.stdout[-3000:]
    return out, plain


@pytest.mark.training
def test_report_of_a_restarted_run(runs, tmp_path):
    out, _ = runs
    state = trainer_state(out)
    want = losses(state)
    assert sorted(want) == list(range(1, STEPS + 1))
    # The restart resumed without overwrite_output_dir, so LLaMA-Factory kept the first
    # launch's records in trainer_log.jsonl: every step is there, none filled in from elsewhere.
    logged = {json.loads(ln)["current_steps"] for ln in open(os.path.join(out, "trainer_log.jsonl"))}
    assert logged == set(range(1, STEPS + 1))
    r = mlaunch("report", out, "--out", str(tmp_path / "rep"), "--window", "2")
    assert r.returncode == 0, r.stderr
    png = str(tmp_path / "rep" / "report.png")
    assert r.stdout.rstrip().endswith(f"plot: {png}")

    # The PNG decodes, and what it plots is the run's: one loss point per step, the restart.
    import matplotlib.image
    pixels = matplotlib.image.imread(png)
    assert pixels.shape[0] > 300 and pixels.shape[1] > 300
    data = json.load(open(tmp_path / "rep" / "series.json"))["runs"]
    assert len(data) == 1
    loss = data[0]["loss"]
    assert [s for s, _ in loss] == list(range(1, STEPS + 1))
    for step, value in loss:  # trainer_log.jsonl rounds to 4 places
        assert value == pytest.approx(want[step], abs=1e-4), step
    (restart,) = data[0]["restarts"]
    assert restart["step"] == SAVE and restart["checkpoint"] == f"{out}/checkpoint-{SAVE}"
    # A world of one has no torchrun and so no root-cause block: the cause is the node's exit
    # from events.jsonl, with the signal it means.
    assert restart["reason"] == "node0: exit 137 (SIGKILL)"
    assert all(rate > 0 and 1 <= step <= STEPS for step, rate in data[0]["throughput"]["points"])

    # The Markdown holds the run's figures.
    md = open(tmp_path / "rep" / "report.md").read()
    assert md in r.stdout
    assert f"| job | {NAME} |" in md
    assert "| nodes × GPUs | 1 × 1 (world 1) |" in md
    assert "| global batch | 2 |" in md
    assert f"| steps | {STEPS} / {STEPS} |" in md
    assert "| restarts | 1 |" in md
    assert f"- step records: {out}/trainer_log.jsonl\n" in md and "trainer_state.json" not in md
    assert f"| final loss | {want[STEPS]:.4f} (step {STEPS}) |" in md
    assert f"| 1 | {out}/checkpoint-{SAVE} | {SAVE} | node0: exit 137 (SIGKILL) |" in md
    for ckpt in (SAVE, STEPS):
        assert f"- {out}/checkpoint-{ckpt}\n" in md
    assert "## Health events\n\nnone: no hang, NaN or world-size event\n" in md   # events.jsonl was read
    m = re.search(r"\| wall time \| (?:(\d+)m )?([\d.]+) ?s \|", md)
    assert m, md
    steady = re.search(r"\| samples/s \(steady state\) \| (.*) \|", md).group(1)
    if data[0]["throughput"]["points"]:
        assert float(steady.split()[0]) > 0
    else:
        assert steady.startswith("n/a: no window of ≥ 2 s")


@pytest.mark.training
def test_report_overlays_two_runs_and_finds_runs_by_id(runs, tmp_path):
    out, plain = runs
    run_id = os.listdir(os.path.join(plain, "logs"))[0]
    r = mlaunch("report", out, run_id, "--runs-under", plain, "--out", str(tmp_path / "cmp"))
    assert r.returncode == 0, r.stderr
    data = json.load(open(tmp_path / "cmp" / "series.json"))["runs"]
    assert [len(d["loss"]) for d in data] == [STEPS, 10]
    assert data[1]["run_id"] == run_id and data[1]["restarts"] == []
    assert r.stdout.count("# mlaunch report: ") == 2
    # A log dir works as RUN too; an unknown id is one line, exit 2.
    logs = os.path.join(plain, "logs", run_id)
    assert mlaunch("report", logs, "--out", str(tmp_path / "one")).returncode == 0
    bad = mlaunch("report", "nosuch-run", "--runs-under", plain)
    assert bad.returncode == 2 and bad.stderr == f"mlaunch: run nosuch-run: no node logs found under {plain}/logs\n"


def _without_matplotlib(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from launcher.cli.main import main\n"
            f"main({list(args)!r})\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def test_missing_matplotlib_is_one_line(tmp_path):
    logs = tmp_path / "out" / "logs" / "t-20260101-000000-abcd"
    logs.mkdir(parents=True)
    (logs / "node0-localhost.log").write_text("hello\n")
    r = _without_matplotlib("report", str(logs))
    assert r.returncode == 2
    assert r.stderr == ("mlaunch: mlaunch report draws with matplotlib, which is not installed here: "
                        "pip install 'mlaunch[report]'\n")


def test_report_of_an_unknown_run_says_so_before_matplotlib(tmp_path):
    r = _without_matplotlib("report", "nosuchrun", env={"MLAUNCH_HOME": str(tmp_path)})
    assert r.returncode == 2
    assert r.stderr == ("mlaunch: RUN 'nosuchrun': not a directory here and no registered run with this "
                        "id prefix or job name (see `mlaunch ps --all`); give a log dir, an output_dir, "
                        "or --runs-under OUTPUT_DIR\n")


# --------------------------------------------------------------------------------------
# pure parts: planted step records
# --------------------------------------------------------------------------------------

def test_windows_per_launch_and_steady_state():
    from launcher.view.report import windows
    from launcher.record.runlog import Step
    # Launch 0: steps 1..20 at 2 s each; launch 1 resumes at 20: steps 21..40 at 1 s each.
    # Windows close at the first step >= 10 s after the last; a tail shorter than that is dropped.
    steps = [Step(s, 1.0, 1e-3, 2.0 * s, 0) for s in range(1, 21)]
    steps += [Step(s, 1.0, 1e-3, 5.0 + (s - 20), 1) for s in range(21, 41)]
    wins, firsts = windows(steps, global_batch=8, min_s=10)
    assert wins == [(3.5, 4.0), (8.5, 4.0), (13.5, 4.0), (26.0, 8.0)]   # 5 steps × 8 / 10 s, 10 × 8 / 10 s
    assert firsts == {0, 3}   # each launch's first window: start-up, not steady state
    assert windows(steps, None, 10)[0][0] == (3.5, 0.5)   # no batch known: steps/s


def test_swift_logging_jsonl_records(tmp_path):
    from launcher.record.runlog import step_records
    run = tmp_path / "v0-20261201-101010"
    run.mkdir()
    recs = [{"loss": 2.0 - s / 10, "grad_norm": 1.0, "learning_rate": 1e-4, "epoch": s / 10,
             "global_step/max_steps": f"{s}/4", "percentage": f"{s * 25:.2f}%",
             "elapsed_time": f"1m {s * 5}s", "remaining_time": "5s", "train_speed(s/it)": 5.0}
            for s in range(1, 5)]
    (run / "logging.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"torn')
    steps, sources = step_records(str(tmp_path))
    assert [(s.step, s.loss, s.lr, s.elapsed) for s in steps] == [
        (1, 1.9, 1e-4, 65.0), (2, 1.8, 1e-4, 70.0), (3, 1.7, 1e-4, 75.0), (4, 1.6, 1e-4, 80.0)]
    assert sources == [str(run / "logging.jsonl")]


def test_steps_after_a_resumed_checkpoint_start_a_new_launch(tmp_path):
    from launcher.record.runlog import step_records
    recs = [{"current_steps": s, "total_steps": 6, "loss": 1.0, "lr": 1e-3, "elapsed_time": "0:00:00"}
            for s in range(1, 7)]
    (tmp_path / "trainer_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    steps, _ = step_records(str(tmp_path), resumed_at={3})
    assert [s.segment for s in steps] == [0, 0, 0, 1, 1, 1]


def test_health_events_and_wall_time_from_events_jsonl(tmp_path):
    from launcher.record import runevents
    lines = [{"time": "2026-12-01T09:00:00.000Z", "run_id": "r", "attempt": 0, "event": "run_start"},
             {"time": "2026-12-01T09:05:00.000Z", "run_id": "r", "attempt": 0, "event": "hang",
              "phase": "training", "silent_s": 300, "limit_s": 300, "last_step": 40},
             {"time": "2026-12-01T09:05:01.000Z", "run_id": "r", "attempt": 1, "event": "restart",
              "reason": "hang", "resume_from": "/o/checkpoint-40"},
             {"time": "2026-12-01T09:30:00.500Z", "run_id": "r", "attempt": 1, "event": "run_end", "code": 0}]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines) + '{"torn')
    events = runevents.read(str(tmp_path))
    assert runevents.wall_s(events) == 1800.5
    assert runevents.restarts(events)[1]["resume_from"] == "/o/checkpoint-40"
    assert runevents.health_lines(events) == [
        "2026-12-01T09:05:00.000Z attempt 0: hang (phase training, silent_s 300, limit_s 300, last_step 40)"]


def test_restart_cause_is_torchruns_root_cause_else_the_nodes_exit(tmp_path):
    """Why an attempt ended: torchrun's root-cause block on the node that failed (not the one
    mlaunch sent SIGTERM); without that block (a world of one, no torchrun), the first failing
    node's exit from events.jsonl with its signal; with neither, say that nothing was found."""
    from launcher.record.runlog import RunPaths, read_run
    block = ("Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-01_09:00:00\n"
             "  exitcode  : {code} (pid: 7)\n  traceback : {why}\n")
    ev = lambda attempt, **kw: json.dumps({"time": "2026-12-01T09:00:00.000Z", "run_id": "r",
                                           "attempt": attempt, **kw}) + "\n"
    cases = {
        "torchrun": ({"node0-a.log": block.format(code=-15, why="Signal 15 (SIGTERM) received by PID 7"),
                      "node1-b.log": block.format(code=-9, why="Signal 9 (SIGKILL) received by PID 8")},
                     [], "node1: exit 137 (Signal 9 (SIGKILL) received by PID 8)"),
        "events": ({"node0-a.log": "step 3\n"},
                   [ev(0, event="node_exit", node=0, host="a", code=0), ev(0, event="node_exit", node=1, host="b", code=137),
                    ev(0, event="node_exit", node=0, host="a", code=143)], "node1: exit 137 (SIGKILL)"),
        "lost": ({"node0-a.log": ""}, [ev(0, event="node_exit", node=2, host="c", code=255, lost=True)],
                 "node2: connection lost"),
        "nothing": ({"node0-a.log": ""}, [], "no root cause in the logs (connection lost or launcher stopped?)"),
    }
    for name, (logs, events, want) in cases.items():
        d = tmp_path / name
        d.mkdir()
        for fname, text in {**logs, "node0-a.attempt1.log": "resumed\n"}.items():
            (d / fname).write_text(text)
        if events:
            (d / "events.jsonl").write_text("".join(events))
        (restart,) = read_run(RunPaths("t-20260101-000000-abcd", str(d), None)).restarts
        assert restart.reason == want, name

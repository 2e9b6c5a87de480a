"""Through the real CLI: registry paths that resolve from any
directory (and say which path is missing when they cannot), the dry run's refusals, `resume`'s
own options, `--resume JOB.yaml`, and the wording for one node."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys

import pytest

from .helpers import CONFIGS, ROOT, SEED000, free_port, load_yaml, mlaunch, write_spec

TICKER = os.path.join(ROOT, "tests", "scripts", "ticker.py")
QUICKSTART = os.path.join(CONFIGS, "quickstart.yaml")


def _job(name: str = "rel", nproc: int = 1, hosts=("localhost",)) -> dict:
    """A `trainer: script` job whose output_dir is relative (to the directory submit runs in)."""
    return {"name": name, "trainer": "script",
            "cluster": {"hosts": list(hosts), "gpus_per_node": nproc, "python": sys.executable,
                        "master_port": free_port()},
            "script": {"path": TICKER, "args": ["3", "0.05", "0"]}, "output_dir": "out"}


class Cli:
    """mlaunch with a private registry, run from a directory of the test's choosing."""

    def __init__(self, tmp_path):
        self.home = str(tmp_path / "home")
        self.sub = tmp_path / "sub"      # where the run is submitted from
        self.other = tmp_path / "other"  # another directory
        self.sub.mkdir()
        self.other.mkdir()

    def __call__(self, *args: str, cwd=None):
        return mlaunch(*args, cwd=str(cwd or self.other), env={"MLAUNCH_HOME": self.home}, timeout=300)

    def row(self, run_id: str) -> dict:
        r = self("ps", "--json", "--all")
        assert r.returncode == 0, r.stderr
        return next(x for x in json.loads(r.stdout) if x["id"] == run_id)

    def db(self) -> sqlite3.Connection:
        return sqlite3.connect(os.path.join(self.home, "runs.db"), isolation_level=None)


@pytest.fixture
def cli(tmp_path) -> Cli:
    return Cli(tmp_path)


@pytest.fixture
def finished(cli) -> str:
    """A run submitted from cli.sub with output_dir `out`, finished: its id."""
    spec = write_spec(cli.sub, _job())
    r = cli("submit", spec, "--no-preflight", cwd=cli.sub)
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "logs in" in ln)
    return line.split("run ", 1)[1].split(":", 1)[0]


def test_registry_paths_are_absolute_and_logs_ps_report_work_from_another_directory(cli, finished):
    pytest.importorskip("matplotlib")
    log_dir = str(cli.sub / "out" / "logs" / finished)
    row = cli.row(finished)
    assert (row["log_dir"], row["output_dir"]) == (log_dir, str(cli.sub / "out"))
    with cli.db() as db:
        paths = json.loads(db.execute("SELECT log_paths FROM attempts WHERE run_id=?",
                                      (finished,)).fetchone()[0])
    assert [os.path.dirname(p) for p in paths] == [log_dir]
    r = cli("logs", finished, "--node", "0", "--tail", "1")
    assert (r.returncode, r.stdout) == (0, "[node0 localhost local0] done rank 0\n"), r.stderr
    r = cli("ps", finished)
    assert r.returncode == 0 and "no node samples" not in r.stdout, r.stdout
    assert "node0  localhost  exit 0" in r.stdout
    assert "attempts:" not in r.stdout       # one attempt, no change: nothing to say
    r = cli("report", finished)                       # by id, through the registry
    assert r.returncode == 0, r.stderr
    assert f"| run | {finished} |" in r.stdout
    assert os.path.isfile(os.path.join(log_dir, "report", "report.md"))
    assert cli("report", "rel", "--out", str(cli.other / "r")).returncode == 0   # by job name
    assert os.path.isfile(cli.other / "r" / "report.md")


def _make_relative(cli: Cli, run_id: str) -> None:
    """What an older mlaunch recorded: the paths as the spec gave them, relative to cli.sub."""
    rel = f"out/logs/{run_id}"
    with cli.db() as db:
        db.execute("UPDATE runs SET log_dir=?, output_dir='out' WHERE id=?", (rel, run_id))
        paths = json.loads(db.execute("SELECT log_paths FROM attempts WHERE run_id=?",
                                      (run_id,)).fetchone()[0])
        db.execute("UPDATE attempts SET log_paths=? WHERE run_id=?",
                   (json.dumps([os.path.join(rel, os.path.basename(p)) for p in paths]), run_id))


def test_an_old_relative_entry_works_from_its_directory_and_names_the_path_elsewhere(cli, finished):
    pytest.importorskip("matplotlib")
    _make_relative(cli, finished)
    rel = f"out/logs/{finished}"
    r = cli("logs", finished, "--node", "0", "--tail", "1", cwd=cli.sub)
    assert (r.returncode, r.stdout) == (0, "[node0 localhost local0] done rank 0\n"), r.stderr
    r = cli("report", finished, "--out", str(cli.sub / "r"), cwd=cli.sub)
    assert r.returncode == 0, r.stderr
    r = cli("logs", finished, "--node", "0", "--tail", "1")
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr.count("\n") == 1, r.stderr
    assert (f"mlaunch: run {finished}: node 0's log (attempt 0) {rel}/node0-localhost.log was "
            "recorded relative to the directory the run was submitted from") in r.stderr
    assert f"is not under {cli.other}; run this command from that directory" in r.stderr
    r = cli("ps", finished)
    assert r.returncode == 0
    assert f"no node samples: log dir {rel} was recorded relative to the directory" in r.stdout
    assert "health.sample_every_s" not in r.stdout
    r = cli("report", finished)
    assert r.returncode == 2 and f"run {finished}: log dir {rel} was recorded relative" in r.stderr


def test_logs_ps_report_of_a_run_whose_log_dir_is_gone_say_so_and_exit_nonzero(cli, finished):
    log_dir = str(cli.sub / "out" / "logs" / finished)
    shutil.rmtree(log_dir)
    r = cli("logs", finished, "--node", "0", "--tail", "1")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"mlaunch: run {finished}: node 0's log (attempt 0) "
                        f"{log_dir}/node0-localhost.log does not exist (deleted or moved?)\n")
    r = cli("logs", finished, "--node", "0", "-f")   # following an ended run: the same
    assert r.returncode == 2 and "does not exist (deleted or moved?)" in r.stderr
    r = cli("ps", finished)
    assert f"no node samples: log dir {log_dir} does not exist (deleted or moved?)" in r.stdout
    r = cli("report", finished)
    assert r.returncode == 2 and r.stderr == (f"mlaunch: run {finished}: log dir {log_dir} does "
                                              "not exist (deleted or moved?)\n")
    console = os.path.join(cli.home, "runs", finished, "console.log")
    os.remove(console)
    r = cli("logs", finished)
    assert r.returncode == 2 and r.stderr == (f"mlaunch: run {finished}: console log {console} "
                                              "does not exist (deleted or moved?)\n")


def test_logs_of_a_run_that_started_no_node_say_so(cli):
    from launcher.record.registry import Registry
    reg = Registry(os.path.join(cli.home, "runs.db"))
    reg.create("never-1", name="never", backend="local", hosts=["localhost"], spec={}, detached=False,
               supervisor=(0, None), log_dir=str(cli.other), output_dir=None)
    reg.set_state("never-1", "failed", exit_code=2)
    r = cli("logs", "never-1", "--node", "0")
    assert (r.returncode, r.stdout, r.stderr) == (2, "", "mlaunch: run never-1 (failed) has started no node\n")
    pytest.importorskip("matplotlib")
    r = cli("report", "never-1")
    assert (r.returncode, r.stderr) == (2, f"mlaunch: run never-1 (failed): no node logs in "
                                           f"{cli.other}; it started no node\n")
    r = cli("report", "no-such-run")
    assert r.returncode == 2 and "no registered run with this id prefix or job name" in r.stderr


CONTRADICT = "mlaunch: --resume and --overwrite contradict each other; pick one\n"


@pytest.mark.parametrize("resume", ["--resume", "--resume=auto"])
def test_dry_run_refuses_resume_with_overwrite_as_submit_does(cli, resume):
    spec = write_spec(cli.sub, _job())
    for extra in (["--dry-run"], ["--no-preflight"]):
        r = cli("submit", spec, resume, "--overwrite", *extra)
        assert (r.returncode, r.stdout, r.stderr) == (2, "", CONTRADICT), extra
    assert os.listdir(cli.sub) == ["job.yaml"]


def test_dry_run_refuses_a_resume_that_submit_refuses(cli):
    data = load_yaml(os.path.join(CONFIGS, "seed003-qwen2.5-14b-swift-lora.yaml"))
    data.setdefault("passthrough", {})["save_only_model"] = True
    spec = write_spec(cli.sub, data)
    assert cli("submit", spec, "--dry-run").returncode == 0
    r = cli("submit", spec, "--resume", "--dry-run")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("mlaunch: --resume: nothing can be resumed: passthrough save_only_model")


def test_resume_offers_neither_resume_nor_overwrite(cli):
    spec = write_spec(cli.sub, _job())
    r = cli("resume", "--help")
    assert r.returncode == 0 and "--overwrite" not in r.stdout and "--resume " not in r.stdout
    assert "submit --resume=PATH" in r.stdout
    r = cli("resume", spec, "--overwrite")
    assert r.returncode == 2 and "No such option '--overwrite'" in r.stderr
    assert "contradict" not in r.stderr
    r = cli("resume", spec, "--dry-run")   # a script writes no checkpoint to resume from
    assert r.returncode == 2 and "--resume needs a trainer that writes checkpoints" in r.stderr
    r = cli("resume", SEED000, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("resume: from the latest complete checkpoint found at launch "
                             "(dry run looks nowhere)\n")


def test_resume_flag_before_the_job_file(cli):
    spec = write_spec(cli.sub, _job())
    want = cli("submit", SEED000, "--resume", "--dry-run", "--run-id", "R1")
    r = cli("submit", "--resume", SEED000, "--dry-run", "--run-id", "R1")   # parsed as meant
    assert (r.returncode, r.stdout, r.stderr) == (0, want.stdout, "")
    assert "resume: from the latest complete checkpoint" in r.stdout
    # Not a dry run: the same refusal as `submit job.yaml --resume` (nothing to resume from).
    r = cli("submit", "--resume", spec, "--no-preflight")
    want = cli("submit", spec, "--resume", "--no-preflight")
    assert r.returncode == want.returncode != 0 and r.stderr == want.stderr, r.stderr
    missing = str(cli.sub / "missing.yaml")
    r = cli("submit", "--resume", missing)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (f"mlaunch: JOB missing: --resume took {missing!r} as its checkpoint; put JOB "
                        "first (mlaunch submit JOB --resume), or write --resume=PATH\n")
    r = cli("submit", "--resume", spec, spec)
    assert r.returncode == 2 and r.stderr == (
        f"mlaunch: --resume {spec}: a job spec file, not a checkpoint directory; give --resume "
        "alone (the latest checkpoint), --resume=auto, or --resume=PATH\n")
    r = cli("submit")
    assert r.returncode == 2 and "Missing argument 'JOB'" in r.stderr


def test_one_node_is_singular_in_validate_dry_run_submit_and_plan(cli):
    r = cli("validate", QUICKSTART)
    ok = [line for line in r.stdout.splitlines() if not line.startswith("note: ")]
    assert ok == [f"{QUICKSTART}: ok (llamafactory, 1 node × 2 processes)"]
    one = write_spec(cli.sub, _job())
    assert cli("validate", one).stdout.endswith(f"\n{one}: ok (script, 1 node × 1 process)\n")
    data = {**_job(hosts=("10.0.0.1", "10.0.0.2"), nproc=2), "output_dir": "/mnt/shared/out"}
    two = write_spec(cli.sub, data, "two.yaml")
    assert cli("validate", two).stdout == f"{two}: ok (script, 2 nodes × 2 processes)\n"
    data["cluster"]["gpus_per_node"] = 1
    two = write_spec(cli.sub, data, "two.yaml")
    assert cli("validate", two).stdout == f"{two}: ok (script, 2 nodes × 1 process)\n"
    r = cli("submit", QUICKSTART, "--dry-run")
    assert "world: 1 node × 2 processes = 2\n" in r.stdout
    assert "global batch: 4 = 1 node × 2 GPUs × 2 per device × 1 accumulation\n" in r.stdout
    head = [line for line in r.stdout.split("\n\n")[0].splitlines() if not line.startswith("note: ")]
    assert " nodes " not in "\n".join(head)
    r = cli("submit", one, "--no-preflight", cwd=cli.sub)
    assert r.returncode == 0, r.stderr
    assert ": 1 node; logs in out/logs/" in r.stdout and "1 nodes" not in r.stdout
    r = cli("plan", QUICKSTART)
    assert "dry run" not in r.stdout
    assert ("config.json is not on this machine and `mlaunch plan` asks no node; submit reads "
            "node 0's copy in preflight)") in r.stdout


def test_one_node_slurm_batch_script_is_singular(cli):
    data = load_yaml(os.path.join(CONFIGS, "slurm", "qwen2-7b-lora.yaml"))
    data["cluster"]["slurm"]["nodes"] = 1
    data["cluster"]["gpus_per_node"] = 1
    data["cluster"]["slurm"]["extra_sbatch"].pop("gres", None)   # it asks for 4: refused with 1
    data["batch"] = {k: v for k, v in data["batch"].items() if k != "global"}
    spec = write_spec(cli.sub, data)
    r = cli("render", spec, "--out", str(cli.other / "r"), "--run-id", "R1")
    assert r.returncode == 0, r.stderr
    head = open(cli.other / "r" / "job.sbatch").read().splitlines()[1]
    assert head == "# mlaunch run R1: 1 node x 1 process, one srun task per node."


def test_ps_of_a_run_lists_each_attempts_hosts_and_why_they_changed(cli, finished):
    """ps RUN and ps RUN --json name each attempt's nodes and every membership change
    (issue 29): here the finished run's own events.jsonl, with what a lost node 1 replaced by
    a spare and then a shrink write after it (launch/spares.py, launch/shrink.py)."""
    from launcher.record.events import EventLog
    log_dir = str(cli.sub / "out" / "logs" / finished)
    EventLog(os.path.join(log_dir, "events.jsonl"), finished, 0).emit(
        "host_replaced", rank=1, old_host="n1", new_host="n4", reason="connection lost", spares_left=0)
    later = EventLog(os.path.join(log_dir, "events.jsonl"), finished, 1)
    later.emit("node_start", node=0, host="localhost")
    later.emit("node_start", node=1, host="n4")
    later.emit("shrink", old_world=2, new_world=1, nodes=["localhost"], old_grad_accum=1,
               new_grad_accum=2, global_batch=2, lost=["n4"])
    r = cli("ps", finished)
    assert r.returncode == 0, r.stderr
    assert "attempts:\n" in r.stdout, r.stdout
    shown = r.stdout.split("attempts:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(shown) == 4, r.stdout
    assert shown[0] == "  attempt 0: 1 nodes: node0 localhost; world 1"   # world: the registry's
    assert shown[1].startswith("  attempt 0: host_replaced (rank 1, old_host n1, new_host n4, "
                               "reason connection lost")
    assert shown[2] == "  attempt 1: 2 nodes: node0 localhost, node1 n4"
    assert "shrink (old_world 2, new_world 1" in shown[3] and "new_grad_accum 2, global_batch 2" in shown[3]
    r = cli("ps", finished, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["attempts"] == [s.strip() for s in shown]
    (row,) = json.loads(r.stdout)["attempt_rows"]   # the registry's row of the one real attempt
    assert (row["n"], row["hosts"], row["world"], row["batch"]) == (0, ["localhost"], 1, None)

"""Issue 27, the command line: one offline decision path, overrides, validate of several
files, --json, help texts, the dry-run's restart/Slurm lines, report fixes, `mlaunch exec`."""
from __future__ import annotations

import json
import os
import re
import sys

import pytest
import yaml

from .helpers import ROOT, SEED000, mlaunch, script_job, write_spec
from .slurmjobs import slurm_script_job
from .test_batchplan import cli_spec, unfit_64_line

QUICK = os.path.join(ROOT, "configs", "quickstart.yaml")
SLURM = os.path.join(ROOT, "configs", "slurm", "qwen2-7b-lora.yaml")


# ---- one decision path -------------------------------------------------------------------

def test_validate_plan_render_and_dry_run_refuse_an_unfit_batch_the_same_way(tmp_path):
    path = cli_spec(tmp_path, gpu_memory_gb=100, batch={"global": 64, "per_device": 64},
                    training={"gradient_checkpointing": False})
    want = ("mlaunch: the batch will not fit on the GPUs; nothing was started:\n"
            f"mlaunch: {unfit_64_line()}\n")
    for args in (("validate", path), ("submit", path, "--dry-run"), ("render", path, "--out", str(tmp_path / "r"))):
        r = mlaunch(*args)
        assert (r.returncode, r.stderr) == (2, want), (args, r.stderr)
    r = mlaunch("plan", path)
    assert r.returncode == 2 and r.stderr == want and "batch: per_device 64" in r.stdout
    assert not os.path.exists(tmp_path / "r")
    assert mlaunch("plan", path, "--force-unfit").returncode == 0
    assert mlaunch("submit", path, "--dry-run", "--force").returncode == 0   # the old name still works


def test_submit_refuses_an_unfit_batch_before_it_connects(tmp_path):
    path = cli_spec(tmp_path, gpu_memory_gb=100, batch={"global": 64, "per_device": 64},
                    training={"gradient_checkpointing": False})
    r = mlaunch("submit", path, "cluster.hosts=[203.0.113.9]", env={"MLAUNCH_HOME": str(tmp_path / "h")})
    assert r.returncode == 2 and r.stderr.endswith(f"mlaunch: {unfit_64_line()}\n"), r.stderr
    assert "cannot reach" not in r.stderr and not os.path.exists(tmp_path / "h" / "runs.db")


def test_validate_refuses_the_options_submit_refuses_too(tmp_path):
    from launcher.errors import UserError
    from launcher.spec import load_spec
    from launcher.runs.attempts import SubmitOptions, check_offline
    with pytest.raises(UserError, match="--resume and --overwrite contradict each other; pick one"):
        check_offline(load_spec(SEED000), SubmitOptions(resume="latest", overwrite=True))


# ---- validate: several files, stdin, --json -----------------------------------------------

def test_validate_several_files_and_stdin(tmp_path):
    bad = write_spec(tmp_path, {**yaml.safe_load(open(QUICK)), "name": "bad name!"}, "bad.yaml")
    with open(QUICK) as fh:
        r = mlaunch("validate", "-", SEED000, bad, stdin=fh)
    assert r.returncode == 2
    assert "<stdin>: ok (llamafactory, 1 node × 2 processes)\n" in r.stdout
    assert f"{SEED000}: ok (llamafactory, 4 nodes × 4 processes)\n" in r.stdout
    assert r.stderr.startswith(f"mlaunch: {bad}: invalid job spec\nmlaunch: name:")
    ok = mlaunch("validate", QUICK, SEED000)
    assert ok.returncode == 0 and ok.stdout.count(": ok (") == 2
    twice = mlaunch("validate", "-", "-", stdin=open(QUICK))
    assert twice.stderr == "mlaunch: validate: - (standard input) given twice; it can be read once\n"


def test_validate_and_dry_run_json(tmp_path):
    r = mlaunch("validate", QUICK, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    notes = got.pop("notes")
    assert got == {"job": QUICK, "ok": True, "trainer": "llamafactory",
                   "summary": "llamafactory, 1 node × 2 processes"}
    # quickstart's paths are relative: validate says where the nodes resolve them
    assert any(n.startswith("output_dir '.quickstart/output' is relative") for n in notes), notes
    bad = write_spec(tmp_path, {**yaml.safe_load(open(QUICK)), "name": "bad name!"}, "bad.yaml")
    both = json.loads(mlaunch("validate", QUICK, bad, "--json").stdout)
    assert [b["ok"] for b in both] == [True, False] and both[1]["problems"][0].startswith("name:")
    d = mlaunch("submit", SEED000, "--dry-run", "--json", "--run-id", "R1")
    assert d.returncode == 0, d.stderr
    plan = json.loads(d.stdout)
    assert (plan["run_id"], plan["backend"], len(plan["nodes"])) == ("R1", "ssh", 4)
    assert plan["restarts"] == {"max_restarts": 0, "backoff_s": 5.0}
    assert plan["nodes"][1]["argv"][0].endswith("torchrun") and "--node-rank" in plan["nodes"][1]["argv"]
    assert mlaunch("submit", SEED000, "--json").stderr == "mlaunch: --json only goes with --dry-run\n"


# ---- a directory as JOB --------------------------------------------------------------------

def test_a_directory_as_job_is_one_line_in_mlaunchs_voice():
    configs = os.path.join(ROOT, "configs")
    want = (f"mlaunch: JOB {configs}: a directory, not a job spec file (it holds allreduce-2x2.yaml, "
            "hostfile-mixed-lora.yaml, quickstart.yaml); give the spec's YAML file, e.g. mlaunch "
            "validate configs/quickstart.yaml\n")
    for cmd in ("validate", "submit", "plan", "check", "render", "exec", "resume"):
        extra = {"render": ["--out", "/tmp/x-never"], "exec": ["--", "true"]}.get(cmd, [])
        r = mlaunch(cmd, configs, *extra)
        assert (r.returncode, r.stderr) == (2, want), (cmd, r.stderr)


# ---- overrides -----------------------------------------------------------------------------

def test_overrides_are_applied_before_validation_and_shown(tmp_path):
    r = mlaunch("submit", SEED000, "training.learning_rate=1e-5", "cluster.hosts=[a,b,c,d]",
                "--dry-run", "--run-id", "R1")
    assert r.returncode == 0, r.stderr
    assert "note: override training.learning_rate=1.0e-05 (the spec says 2.0e-5)\n" in r.stdout
    assert "note: override cluster.hosts=[a, b, c, d] (the spec says [192.168.1.10, 192.168.1.11, " in r.stdout
    assert "learning_rate: 1.0e-05\n" in r.stdout and "node 0: a (ssh " in r.stdout
    v = mlaunch("validate", SEED000, "cluster.hosts=[a,b]", "batch.global=128")
    assert v.returncode == 0 and v.stdout.endswith(f"{SEED000}: ok (llamafactory, 2 nodes × 4 processes)\n")
    p = mlaunch("plan", SEED000, "batch.per_device=1", "batch.grad_accum=16")
    assert p.returncode == 0 and "batch: per_device 1 × grad_accum 16" in p.stdout
    out = tmp_path / "r"
    assert mlaunch("render", SEED000, "training.learning_rate=3e-4", "--out", str(out)).returncode == 0
    assert "learning_rate: 0.0003\n" in (out / "llamafactory.yaml").read_text()


def test_override_errors_name_the_override():
    r = mlaunch("validate", SEED000, "cluster.master_port=70000")
    assert r.returncode == 2
    assert re.search(r"^mlaunch: cluster\.master_port: .* \(set by the override cluster\.master_port=70000\)$",
                     r.stderr, re.M), r.stderr
    r = mlaunch("submit", SEED000, "name.x=1", "--dry-run")
    assert r.stderr == ("mlaunch: invalid override on the command line\nmlaunch: override name.x=1: "
                        "name is 'qwen2-7b-lora', not a mapping; override name itself\n")
    r = mlaunch("validate", SEED000, "cluster.hosts=[a,")
    assert r.returncode == 2 and r.stderr.startswith(
        "mlaunch: invalid override on the command line\nmlaunch: override cluster.hosts=[a,: the value "
        "is not YAML")


def test_a_secret_override_is_refused_and_its_reference_masked_in_the_dry_run():
    """A literal secret on the command line would stay in mlaunch's argv (issue 51 item 8):
    refused in one line that never echoes it; the ${NAME} way passes and is masked."""
    r = mlaunch("submit", SEED000, "cluster.env.HF_TOKEN=hf_abcdefgh12345", "--dry-run")
    assert r.returncode == 2 and "hf_abcdefgh12345" not in r.stdout + r.stderr, r.stderr
    assert "write cluster.env.HF_TOKEN='${HF_TOKEN}'" in r.stderr, r.stderr
    r = mlaunch("submit", SEED000, "cluster.env.HF_TOKEN=${HF_TOKEN}", "--dry-run",
                env={"HF_TOKEN": "hf_abcdefgh12345"})
    assert r.returncode == 0, r.stderr
    assert "hf_abcdefgh12345" not in r.stdout, r.stdout


@pytest.mark.launches
def test_overrides_are_stored_with_the_run_in_the_registry(tmp_path):
    from launcher.record.registry import Registry
    out = str(tmp_path / "out")
    spec = write_spec(tmp_path, script_job(["localhost"], 1, "steps.py", ["2", "0.01"], out))
    r = mlaunch("submit", spec, "script.args=[3,0.01]", "max_restarts=1",
                env={"MLAUNCH_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stdout + r.stderr
    run = Registry(str(tmp_path / "home" / "runs.db")).runs(include_final=True)[0]
    stored = Registry(str(tmp_path / "home" / "runs.db")).get(run.id).spec
    assert stored["script"]["args"] == ["3", "0.01"] and stored["max_restarts"] == 1


# ---- help texts ----------------------------------------------------------------------------

def test_help_texts_say_what_each_flag_forces_and_what_run_is():
    top = mlaunch("--help").stdout
    assert "..." not in top.split("Commands:")[1]
    assert ("  exec      Run CMD on every node of JOB at once; exit 0 only if it succeeded\n"
            "            on every node.\n") in top
    submit = " ".join(mlaunch("submit", "--help").stdout.split())
    assert ("--force-unfit, --force Launch although the memory estimate says the batch will not fit "
            "the GPUs (forces nothing else: preflight and output_dir checks still refuse).") in submit
    assert "--json With --dry-run: the plan as JSON on stdout." in submit
    plan = " ".join(mlaunch("plan", "--help").stdout.split())
    assert "--force-unfit, --force Exit 0 although the estimate says the batch will not fit" in plan
    stop = " ".join(mlaunch("stop", "--help").stdout.split())
    assert "--kill, --force SIGKILL every process at once instead of TERM, a grace period, then KILL." in stop
    for cmd in ("ps", "logs", "stop", "attach"):
        text = " ".join(mlaunch(cmd, "--help").stdout.split())
        assert ("RUN is a run id, a unique prefix of one, or a job name (its latest run), as "
                "`mlaunch ps --all` lists them.") in text, cmd
    report = mlaunch("report", "--help").stdout
    assert report.startswith("Usage: mlaunch report [OPTIONS] RUN [RUN_B]\n")
    assert "--report-dir, --out DIR" in report and "--runs-under, --output-dir OUTPUT_DIR" in report
    three = mlaunch("report", "a", "b", "c")
    assert three.returncode == 2 and "Got unexpected extra argument (c)" in three.stderr
    assert "validate [OPTIONS] JOB... [KEY=VALUE]..." in mlaunch("validate", "--help").stdout


# ---- what the dry-run shows ----------------------------------------------------------------

def test_dry_run_shows_mlaunchs_restart_policy():
    r = mlaunch("submit", SEED000, "--dry-run", "--max-restarts", "3")
    assert ("restarts: up to 3 (max_restarts), each 5s after a node failure (restart_backoff_s), "
            "every node relaunched from the latest complete checkpoint\n") in r.stdout
    r = mlaunch("submit", SEED000, "--dry-run")
    assert ("restarts: none (max_restarts 0): a node failure ends the run (max_restarts: N, or "
            "--max-restarts N, relaunches every node; torchrun's own --max-restarts stays 0)\n") in r.stdout


def test_slurm_dry_run_says_submit_runs_no_preflight_and_shows_ds_sources():
    r = mlaunch("submit", SLURM, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert ("preflight: none at submit under Slurm (no node is allocated before sbatch); "
            "`mlaunch check` runs it through srun\n") in r.stdout
    assert "submit's preflight picks the key" not in r.stdout
    assert ("# transformers version not probed: under Slurm submit runs no preflight, so warmup_ratio "
            "stays; transformers up to 5.14 accept it, 5.15 and later reject it (there set "
            "training.warmup_steps instead)\n") in r.stdout
    full = mlaunch("submit", os.path.join(ROOT, "configs", "slurm", "qwen2-7b-full-zero3.yaml"), "--dry-run")
    assert "# where each value comes from (not part of the file):\n# train_batch_size " in full.stdout


# ---- report of a script job ----------------------------------------------------------------

@pytest.mark.launches
def test_report_of_a_script_job_reads_steps_and_losses_from_its_events(tmp_path):
    pytest.importorskip("matplotlib")
    logs = tmp_path / "out" / "logs" / "t-20260101-000000-abcd"
    logs.mkdir(parents=True)
    (logs / "node0-localhost.log").write_text("step 1\n")
    events = [{"time": f"2026-01-01T00:00:{i:02d}Z", "run_id": "t-20260101-000000-abcd", "attempt": 0,
               "event": "step" if i else "run_start", **({"step": i, "loss": 1.0 / i} if i else {})}
              for i in range(0, 31)]
    (logs / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    r = mlaunch("report", str(logs), "--report-dir", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    assert "| steps | 30 |" in r.stdout and "| final loss | 0.0333 (step 30) |" in r.stdout


# ---- mlaunch exec --------------------------------------------------------------------------

@pytest.mark.launches
def test_exec_on_this_machine_and_its_exit_table(tmp_path):
    spec = write_spec(tmp_path, script_job(["localhost"], 1, "steps.py", [], str(tmp_path / "o")))
    r = mlaunch("exec", spec, "cluster.env.GREETING=hi", "--", "echo $GREETING from node; exit 3")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "[node0 localhost] hi from node\n" in r.stdout
    assert re.search(r"^\[mlaunch\] 0 +localhost 3$", r.stdout, re.M), r.stdout
    assert "[mlaunch] exec: 0 of 1 node succeeded; 1 failed\n" in r.stdout
    ok = mlaunch("exec", spec, "--", sys.executable, "-c", "print('argv ok')")
    assert ok.returncode == 0 and "[node0 localhost] argv ok\n" in ok.stdout
    none = mlaunch("exec", spec)
    assert none.stderr == ("mlaunch: exec: no CMD; put the command after --, e.g. mlaunch exec job.yaml "
                           "-- nvidia-smi\n")


@pytest.mark.multihost
def test_exec_on_every_namespace_host_at_once(make_hostset, tmp_path):
    from .test_fanout import job_pids
    with make_hostset(3) as hs:
        spec = write_spec(tmp_path, script_job([h.ip for h in hs.hosts], 1, "steps.py", [],
                                               str(tmp_path / "o"), hs=hs))
        r = mlaunch("exec", spec, "--", "hostname; test $(hostname) != " + hs.hosts[1].name)
        assert r.returncode == 1, r.stdout + r.stderr
        for i, h in enumerate(hs.hosts):
            assert f"[node{i} {h.ip}] {h.name}\n" in r.stdout
            assert re.search(rf"^\[mlaunch\] {i} +{re.escape(h.ip)} {1 if i == 1 else 0}$", r.stdout, re.M)
        assert "[mlaunch] exec: 2 of 3 nodes succeeded; 1 failed\n" in r.stdout
        ok = mlaunch("exec", spec, "--", "true")
        assert ok.returncode == 0 and "exec: 3 of 3 nodes succeeded\n" in ok.stdout
        assert all(job_pids(h, set()) == set() for h in hs.hosts)
        hs.hosts[2].stop_sshd()
        down = mlaunch("exec", spec, "--", "true")
        assert down.returncode == 2
        assert down.stderr.startswith("mlaunch: exec: cannot reach every host; the command ran nowhere:\n")
        assert f"host {hs.hosts[2].ip}: connection refused on port 22" in down.stderr


@pytest.mark.multihost
def test_exec_under_slurm_runs_through_srun_in_an_allocation(slurm2, tmp_path):
    spec = write_spec(tmp_path, slurm_script_job(tmp_path, "steps.py", ["1", "0"]))
    r = mlaunch("exec", spec, "--", "echo on $(hostname) job $SLURM_JOB_ID", env={"SLURM_CONF": slurm2.conf},
                timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    names = [h.name for h in slurm2.hs.hosts]
    for i, name in enumerate(names):
        assert re.search(rf"^\[node{i} {name}\] on {name} job \d+$", r.stdout, re.M), r.stdout
    assert "exec: 2 of 2 nodes succeeded\n" in r.stdout

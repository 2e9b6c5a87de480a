"""Issue 56, first contact round two: a LLaMA-Factory user's own YAML (validate names each key's
place, `mlaunch init --from-llamafactory` writes the spec, LLaMA-Factory-style overrides),
refused submits that are not runs, hints, flags and aliases, overrides echoed, SSH failure lines,
reports keyed by run, and the trainers' own rules."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from .helpers import CONFIGS, SSH_CONNECT_S, load_yaml, mlaunch
from .lf_examples import OWN, example

CORPUS = os.path.join(CONFIGS, "lf-examples")


def write_lf(folder, name: str) -> str:
    """LLaMA-Factory's example `name` as its own YAML, with its DeepSpeed file beside it."""
    data = example(name)
    if "deepspeed" in data:
        from .test_lf_examples import auto_ds_config
        ds = os.path.join(folder, data["deepspeed"])
        os.makedirs(os.path.dirname(ds), exist_ok=True)
        stem = os.path.basename(ds).removesuffix("_config.json")
        with open(ds, "w") as fh:
            json.dump(auto_ds_config(stem), fh)
    path = os.path.join(folder, f"{name}.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)
    return path


# ---- item 3: a LLaMA-Factory YAML given as is ----------------------------------------------

def test_validate_names_the_place_of_each_key_of_a_llamafactory_yaml(tmp_path):
    r = mlaunch("validate", write_lf(str(tmp_path), "qwen3_lora_sft"))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert "a LLaMA-Factory YAML, not an mlaunch job spec" in lines[0]
    assert "mlaunch init --from-llamafactory" in lines[0]
    for want in ("per_device_train_batch_size: 1 → batch.per_device: 1", "bf16: true → precision: bf16",
                 "learning_rate: 0.0001 → training.learning_rate: 0.0001",
                 "model_name_or_path: Qwen/Qwen3-4B-Instruct-2507 → model: Qwen/Qwen3-4B-Instruct-2507",
                 "lora_rank: 8 → finetuning.lora_rank: 8", "num_train_epochs: 3.0 → training.epochs: 3.0",
                 "plot_loss: true → passthrough.plot_loss (given to LLaMA-Factory as is)"):
        assert f"mlaunch: {want}" in lines, (want, lines)
    assert len(lines) == 1 + len(example("qwen3_lora_sft"))       # every key, none cut off
    assert "unknown key" not in r.stderr and "trainer: required" not in r.stderr


def comparable(spec: dict, drop: tuple[str, ...] = ()) -> dict:
    from launcher.spec import validate
    out = validate(spec).model_dump(by_alias=True, exclude={"name", "cluster"})
    for key in drop:
        out["training"].pop(key)
    return out


@pytest.mark.parametrize("name", sorted(OWN))
def test_init_from_llamafactory_writes_the_corpus_spec(tmp_path, name):
    """Each LLaMA-Factory example, given to init as is, becomes the spec the acceptance corpus
    holds for it (checked against LLaMA-Factory's own parser in test_lf_examples), validated."""
    lf = write_lf(str(tmp_path), name)
    r = mlaunch("init", "--from-llamafactory", lf, "--hosts", "node0,node1", "--gpus-per-node", "4",
                "--workdir", "/mnt/shared/work")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    job = tmp_path / "job.yaml"
    job.write_text(r.stdout)
    assert mlaunch("validate", str(job)).returncode == 0
    got = yaml.safe_load(r.stdout)
    assert got["cluster"] == {"hosts": ["node0", "node1"], "gpus_per_node": 4, "workdir": "/mnt/shared/work"}
    # The preprocess example states no ddp_timeout: mlaunch's own default then, not the Trainer's.
    drop = ("ddp_timeout",) if name == "qwen3_preprocess" else ()
    assert comparable(got, drop) == comparable(load_yaml(os.path.join(CORPUS, f"{name}.yaml")), drop)


def test_init_refuses_a_file_that_is_no_llamafactory_yaml(tmp_path):
    r = mlaunch("init", "--from-llamafactory", os.path.join(CONFIGS, "quickstart.yaml"), "--hosts", "a",
                "--gpus-per-node", "1")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a LLaMA-Factory training YAML" in r.stderr


def test_llamafactory_style_overrides_set_the_field_they_map_to(tmp_path):
    job = os.path.join(CONFIGS, "lf-examples", "qwen3_lora_sft.yaml")
    r = mlaunch("validate", job, "learning_rate=1e-5", "num_train_epochs=1", "per_device_train_batch_size=2")
    assert r.returncode == 0, r.stderr
    assert ("note: override training.learning_rate=1.0e-05 (the spec says 0.0001; learning_rate is "
            "llamafactory's name for it)") in r.stdout
    from launcher.spec import load_spec
    from launcher.spec.overrides import parse
    spec = load_spec(job, parse(("learning_rate=1e-5", "num_train_epochs=1", "per_device_train_batch_size=2")))
    assert (spec.training.learning_rate, spec.training.epochs, spec.batch.per_device) == (1e-5, 1, 2)
    r = mlaunch("validate", job, "bf16=false")
    assert r.returncode == 2 and "override bf16=false: bf16 is llamafactory's key for the spec's precision" in r.stderr
    swift = os.path.join(CONFIGS, "seed003-qwen2.5-14b-swift-lora.yaml")
    r = mlaunch("validate", swift, "lr=2e-5")
    assert r.returncode == 0 and "override training.learning_rate=2.0e-05" in r.stdout, r.stderr


# ---- item 5: refused submits are not runs ---------------------------------------------------

def script_spec(tmp_path, name: str, hosts: list[str]) -> str:
    from .helpers import write_spec
    return write_spec(tmp_path, {"name": name, "trainer": "script", "script": {"path": "/abs/x.py"},
                                 "cluster": {"hosts": hosts, "gpus_per_node": 1},
                                 "output_dir": str(tmp_path / "out")}, f"{name}.yaml")


def registered(home: str, name: str, state: str, attempts: int, log_dir: str | None) -> str:
    """A run as the registry holds it (an older mlaunch's refused submit: failed, 0 attempts)."""
    from launcher.record.registry import Registry
    reg = Registry(os.path.join(home, "runs.db"))
    run_id = f"{name}-{state}-{attempts}"
    reg.create(run_id, name=name, backend="ssh", hosts=["a"], spec={}, detached=False,
               supervisor=(1, None), log_dir=log_dir, output_dir=None)
    if attempts:
        reg.attempt_started(run_id, 0, "a0", [], None)
    reg.set_state(run_id, state, only_from=("starting", "running"), exit_code=0 if state == "succeeded" else 2)
    reg.close()
    return run_id


def test_a_refused_submit_is_no_run_and_a_job_name_finds_the_run_that_ran(tmp_path):
    """Unreachable hosts refuse the submit (nothing started): no row, no console log; `ps NAME`
    and `logs NAME` keep resolving to the job's last run that ran. A refusal an older mlaunch
    registered (failed, no attempt, no log dir) is hidden from `ps --all` and never chosen."""
    home = str(tmp_path / "home")
    os.makedirs(home)
    env = {"MLAUNCH_HOME": home}
    logs = tmp_path / "ran-logs"
    logs.mkdir()
    ran = registered(home, "qs", "succeeded", 1, str(logs))
    old_refusal = registered(home, "qs", "failed", 0, str(tmp_path / "never-made"))
    r = mlaunch("submit", script_spec(tmp_path, "qs", ["nohost.invalid"]), "--run-id", "qs-refused", env=env)
    assert r.returncode == 2 and "nothing was started" in r.stderr and "Traceback" not in r.stderr, r.stderr
    listed = mlaunch("ps", "--all", "--json", env=env)
    assert [row["id"] for row in json.loads(listed.stdout)] == [ran], listed.stdout
    one = mlaunch("ps", "qs", "--json", env=env)
    assert json.loads(one.stdout)["id"] == ran, one.stdout
    assert not os.path.exists(os.path.join(home, "runs", "qs-refused"))
    assert mlaunch("ps", old_refusal, env=env).returncode == 0    # by its id, still there


# ---- item 8: hints that point the right way ------------------------------------------------

def lf_spec_problems(*overrides: str) -> list[str]:
    r = mlaunch("validate", os.path.join(CORPUS, "qwen3_lora_sft.yaml"), *overrides)
    assert r.returncode == 2, r.stdout
    return [line.removeprefix("mlaunch: ").split(" (set by the override")[0] for line in r.stderr.splitlines()[1:]]


def test_hints_point_the_right_way():
    got = lf_spec_problems("training.max_restarts=2", "cluster.nodes=2", "finetuning.type=LoRA",
                           "training.grad_accum=2")
    assert got == [
        "cluster.nodes: unknown key: the nodes are the list cluster.hosts: [node0, node1] (under Slurm: "
        "cluster.slurm.nodes: N); write that instead",
        "finetuning.type: 'LoRA' is not one of lora, oft, freeze, full; did you mean 'lora'?",
        "training.max_restarts: unknown key: max_restarts is a top-level key; move it out of training:",
        "training.grad_accum: unknown key: it belongs at batch.grad_accum; move it there"], got
    got = lf_spec_problems("trainer=torchrun")
    assert got == ["trainer: 'torchrun' is not one of llamafactory, swift, script: any script started "
                   "by torchrun is `trainer: script` with `script: {path: train.py, args: [...]}`"], got


def test_script_args_as_one_string_gets_the_list_of_its_words(tmp_path):
    """The fix offered, pasted back, gives the script its four arguments."""
    from .helpers import write_spec
    data = {"name": "t", "trainer": "script", "script": {"path": "/abs/x.py", "args": "--epochs 3 --lr 3e-4"},
            "cluster": {"hosts": ["a"], "gpus_per_node": 1}, "output_dir": "/tmp/o"}
    r = mlaunch("validate", write_spec(tmp_path, data))
    line = r.stderr.splitlines()[1]
    assert line == ("mlaunch: script.args: '--epochs 3 --lr 3e-4' is one value, not a list: write "
                    "`args: [--epochs, 3, --lr, 3e-4]` (4 arguments, as a shell splits them)"), line
    data["script"]["args"] = yaml.safe_load(line.split("`args: ")[1].split("`")[0])
    from launcher.spec import validate
    assert validate(data).script.args == ["--epochs", "3", "--lr", "3e-4"]


def test_an_unset_secret_reference_says_export_never_write_it(monkeypatch):
    r = mlaunch("validate", os.path.join(CORPUS, "qwen3_lora_sft.yaml"), 'cluster.env={HF_TOKEN: "${MLAUNCH_T56}"}')
    assert "export MLAUNCH_T56=… in the shell that runs mlaunch (the value never goes into the spec file)" \
        in r.stderr and "write the value" not in r.stderr, r.stderr


def test_memory_refusal_names_the_flag_that_exists():
    from .test_batchplan import unfit_64_line
    assert unfit_64_line().endswith("(or --force-unfit)")


# ---- item 9: flags and other tools' words -----------------------------------------------------

@pytest.mark.parametrize("word,ours", [("launch", "submit"), ("run", "submit"), ("status", "ps"),
                                       ("queue", "ps"), ("cancel", "stop")])
def test_other_tools_words_run_our_commands(word, ours):
    r = mlaunch(word, "--help")
    assert r.returncode == 0 and r.stdout.startswith(f"Usage: mlaunch {ours} "), r.stdout[:80]


def test_aliases_are_listed_and_a_launch_dry_runs(tmp_path):
    assert "launch = submit" in mlaunch("--help").stdout
    r = mlaunch("launch", os.path.join(CONFIGS, "quickstart.yaml"), "--dry-run")
    assert r.returncode == 0 and "mlaunch plan: job quickstart" in r.stdout, r.stderr


def test_check_takes_overrides_and_old_flag_names_say_the_new_one(tmp_path):
    r = mlaunch("check", os.path.join(CONFIGS, "quickstart.yaml"), "cluster.hosts=[nohost.invalid]", "--json",
                env={"MLAUNCH_HOME": str(tmp_path)})
    assert r.returncode == 1 and "nohost.invalid" in r.stdout and "Traceback" not in r.stderr, r.stderr
    r = mlaunch("submit", os.path.join(CONFIGS, "quickstart.yaml"), "--dry-run", "--force")
    assert r.returncode == 0
    assert "mlaunch: note: submit --force is the old name of --force-unfit; it still works" in r.stderr
    r = mlaunch("report", "nothing-here", "--output-dir", str(tmp_path))
    assert "mlaunch: note: report --output-dir is the old name of --runs-under; it still works" in r.stderr


# ---- item 6: overrides echoed, and refused where a resume would not use them ----------------

def test_a_live_submit_echoes_its_overrides(tmp_path):
    r = mlaunch("submit", os.path.join(CORPUS, "qwen3_lora_sft.yaml"), "cluster.hosts=[nohost.invalid]",
                "learning_rate=1e-5", env={"MLAUNCH_HOME": str(tmp_path)})
    assert r.returncode == 2 and "nothing was started" in r.stderr, r.stderr
    assert r.stdout.splitlines()[:2] == [
        "note: override cluster.hosts=[nohost.invalid] (the spec says [node0, node1])",
        "note: override training.learning_rate=1.0e-05 (the spec says 0.0001; learning_rate is llamafactory's "
        "name for it)"], r.stdout


@pytest.mark.parametrize("args", [("submit", "--resume"), ("resume",), ("submit", "--resume=/o/checkpoint-4")])
def test_an_optimizer_override_on_resume_is_refused_with_the_reason(tmp_path, args):
    """The HF Trainer restores lr and the optimizer's settings from optimizer.pt: the override
    would only be written down (issue 56 saw 1e-3 go on under a recorded 5e-4)."""
    cmd, *flags = args
    r = mlaunch(cmd, os.path.join(CORPUS, "qwen3_lora_sft.yaml"), *flags, "--dry-run", "training.learning_rate=5e-4",
                "passthrough.weight_decay=0.1", env={"MLAUNCH_HOME": str(tmp_path)})
    assert r.returncode == 2, r.stdout
    lines = r.stderr.splitlines()
    assert [line.split(" with ")[0] for line in lines] == ["mlaunch: override training.learning_rate",
                                                            "mlaunch: override passthrough.weight_decay"], lines
    assert "restores its optimizer state (learning rate and optimizer settings) from the checkpoint" in lines[0]


def test_a_schedule_override_on_resume_is_taken(tmp_path):
    """A new lr_scheduler or warmup takes effect on resume (made again over the saved base rate)."""
    r = mlaunch("resume", os.path.join(CORPUS, "qwen3_lora_sft.yaml"), "--dry-run", "training.lr_scheduler=linear",
                env={"MLAUNCH_HOME": str(tmp_path)})
    assert r.returncode == 0 and "note: override training.lr_scheduler=linear (the spec says cosine)" in r.stdout


def test_resume_auto_refuses_an_optimizer_override_once_it_finds_a_checkpoint():
    from launcher.errors import UserError
    from launcher.runs.attempts import SubmitOptions, refuse_restored_overrides, check_flags
    from launcher.spec import load_spec
    from launcher.spec.overrides import parse
    job = load_spec(os.path.join(CORPUS, "qwen3_lora_sft.yaml"), parse(("learning_rate=5e-4",)))
    opts = SubmitOptions(resume="auto", overridden=job._overridden)
    check_flags(job, opts)   # nothing to refuse yet: auto may start fresh
    with pytest.raises(UserError, match="override training.learning_rate with resume from /o/checkpoint-4: "):
        refuse_restored_overrides(job, opts, "resume from /o/checkpoint-4")


# ---- item 7: one line with the fix for every way SSH fails --------------------------------------

SILENT_SSHD = ("import socket,sys\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
               "s.bind(('0.0.0.0',22)); s.listen(16); print('listening', flush=True)\nheld=[]\n"
               "while True:\n    c,_=s.accept(); held.append(c)\n")


@pytest.mark.multihost
def test_every_ssh_failure_is_one_line_with_its_fix_and_check_counts_its_connects(make_hostset, tmp_path):
    """Node 1 takes TCP on port 22 and never says a word (a listening socket in its namespace),
    then it asks for a key mlaunch does not hold, then its host key is unknown: `check` and
    `submit` each print one line naming the host and the fix, no library traceback; check's
    time counts the connect it waited for (it said "in 0.0s" after 14 s)."""
    from .helpers import script_job, write_spec
    with make_hostset(2) as hs:
        a, b = hs.hosts
        job = script_job([a.ip, b.ip], 1, "tick_job.py", [str(tmp_path)], str(tmp_path / "out"), hs=hs)
        spec = write_spec(tmp_path, job)
        env = {"MLAUNCH_HOME": str(tmp_path / "home")}
        b.stop_sshd()
        silent = b.popen([sys.executable, "-c", SILENT_SSHD], stdout=subprocess.PIPE, text=True)
        try:
            assert silent.stdout.readline() == "listening\n"
            check = mlaunch("check", spec, env=env)
            sub = mlaunch("submit", spec, env=env)
        finally:
            silent.kill()
            silent.wait()
        b.start_sshd()
        stranger = tmp_path / "stranger_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
        auth = mlaunch("submit", spec, f"cluster.ssh.key_file={stranger}", env=env)
        empty = tmp_path / "known_hosts"
        empty.write_text("")
        hostkey = mlaunch("submit", spec, f"cluster.ssh.known_hosts={empty}", env=env)
    for r in (check, sub, auth, hostkey):
        text = r.stdout + r.stderr
        assert "Traceback" not in text and "paramiko." not in text and "File \"" not in text, text[-3000:]
    assert check.returncode == 1, check.stdout + check.stderr
    seconds = float(re.search(r"preflight on 2 nodes in ([\d.]+)s", check.stdout)[1])
    assert seconds >= SSH_CONNECT_S, check.stdout   # the connect_timeout it waited out on node 1
    assert re.search(rf"✗ ssh on node1 {re.escape(b.ip)}: no SSH (banner|handshake) in {SSH_CONNECT_S}s.*\n    fix: .*raise "
                     r"cluster\.ssh\.connect_timeout", check.stdout), check.stdout
    assert sub.returncode == 2 and "nothing was started anywhere" in sub.stderr, sub.stderr
    (line,) = [ln for ln in sub.stderr.splitlines() if f"host {b.ip}:" in ln]
    assert re.search(rf"no SSH (banner|handshake) in {SSH_CONNECT_S}s .*the machine takes connections but its sshd does "
                     r"not answer .*raise cluster\.ssh\.connect_timeout", line), line
    assert auth.returncode == 2 and "nothing was started anywhere" in auth.stderr, auth.stderr
    lines = [ln for ln in auth.stderr.splitlines() if f"host {a.ip}:" in ln or f"host {b.ip}:" in ln]
    assert len(lines) == 2 and all("authentication failed" in ln and "key_file" in ln for ln in lines), lines
    assert hostkey.returncode == 2, hostkey.stderr
    lines = [ln for ln in hostkey.stderr.splitlines() if f"host {a.ip}:" in ln or f"host {b.ip}:" in ln]
    assert len(lines) == 2 and all("ssh-keyscan" in ln for ln in lines), hostkey.stderr


# ---- item 4: reports keyed by run and attempt ---------------------------------------------------

@pytest.mark.training
def test_reports_of_two_runs_sharing_an_output_dir_keep_each_runs_own_steps(tmp_path):
    """Run A trains 8 steps; run B resumes A's checkpoint-8 to 12 in the same output_dir (one
    trainer_log.jsonl holds both). A's report: its 8 steps and its own last loss; B's: the
    resume marked, its steps 9-12; A against B: a folder of its own, A's report.png untouched."""
    from .training import build_tiny, lf_spec, require_trainer, submit_timed
    require_trainer()
    pytest.importorskip("matplotlib")
    tiny = build_tiny(str(tmp_path / "tiny"))
    out = str(tmp_path / "out")
    home = {"MLAUNCH_HOME": str(tmp_path / "home")}
    before = os.environ.get("MLAUNCH_HOME")   # the suite's own (conftest.py): put back after
    os.environ.update(home)   # submit_timed's mlaunch reads it
    try:
        a = submit_timed(tmp_path, lf_spec(tiny, ["localhost"], 1, out, max_steps=8, save_steps=4, name="share"),
                         preflight=True)
        assert a.returncode == 0, a.stdout[-3000:]
        # item 10: CPU nodes get one batch line, not a GPU memory plan
        assert "memory plan (per GPU)" not in a.stdout, a.stdout[-3000:]
        assert ("batch: per_device 2 × grad_accum 1 (the nodes have no GPU: no GPU memory plan)"
                in a.stdout), a.stdout[-3000:]
        b = submit_timed(tmp_path, lf_spec(tiny, ["localhost"], 1, out, max_steps=12, save_steps=4, name="share"),
                         "--resume")
        assert b.returncode == 0, b.stdout[-3000:]
    finally:
        if before is None:
            os.environ.pop("MLAUNCH_HOME")
        else:   # a later test in this worker reads the suite's home (test_run_end.py did not find it)
            os.environ["MLAUNCH_HOME"] = before
    run_a, run_b = sorted(os.listdir(os.path.join(out, "logs")))
    logged = [r for r in map(json.loads, open(os.path.join(out, "trainer_log.jsonl"))) if "loss" in r]
    steps = [r["current_steps"] for r in logged]
    assert steps[:8] == list(range(1, 9)) and steps[-1] == 12, steps
    a_loss = {r["current_steps"]: r["loss"] for r in logged[:8]}
    b_loss = {r["current_steps"]: r["loss"] for r in logged[8:]}   # from 8: transformers logs it again
    b_first = logged[8]["current_steps"]

    rep_a = mlaunch("report", os.path.join(out, "logs", run_a), env=home)
    assert rep_a.returncode == 0, rep_a.stderr
    data_a = json.load(open(os.path.join(out, "logs", run_a, "report", "series.json")))["runs"][0]
    assert data_a["loss"] == [[s, a_loss[s]] for s in range(1, 9)]
    assert "| steps | 8 / 8 |" in rep_a.stdout and f"| final loss | {a_loss[8]:.4f} (step 8) |" in rep_a.stdout
    assert "shared with 1 other run(s)" in rep_a.stdout
    png_a = os.path.join(out, "logs", run_a, "report", "report.png")
    before = open(png_a, "rb").read()

    rep_b = mlaunch("report", os.path.join(out, "logs", run_b), env=home)
    assert rep_b.returncode == 0, rep_b.stderr
    data_b = json.load(open(os.path.join(out, "logs", run_b, "report", "series.json")))["runs"][0]
    assert data_b["loss"] == [[s, b_loss[s]] for s in range(b_first, 13)]
    assert data_b["resumed_from"] == {"checkpoint": f"{out}/checkpoint-8", "step": 8}
    assert f"| resumed from | {out}/checkpoint-8 |" in rep_b.stdout
    assert f"| steps | 12 / 12 (this run's steps {b_first}–12) |" in rep_b.stdout

    vs = mlaunch("report", os.path.join(out, "logs", run_a), os.path.join(out, "logs", run_b), env=home)
    assert vs.returncode == 0, vs.stderr
    folder = os.path.join(out, "logs", run_a, f"report-vs-{run_b}")
    assert vs.stdout.rstrip().endswith(f"plot: {folder}/report.png")
    pair = json.load(open(os.path.join(folder, "series.json")))["runs"]
    assert [len(d["loss"]) for d in pair] == [8, 13 - b_first]
    assert open(png_a, "rb").read() == before
    import shutil
    keep = os.environ.get("MLAUNCH_TEST_KEEP_PNG")
    if keep:   # to look at it
        shutil.copy(os.path.join(folder, "report.png"), os.path.join(keep, "vs.png"))
        shutil.copy(os.path.join(out, "logs", run_b, "report", "report.png"), os.path.join(keep, "b.png"))


def test_a_flat_loss_is_not_zoomed_into_its_noise_and_empty_panels_are_left_out(tmp_path):
    pytest.importorskip("matplotlib")
    from launcher.view.report import plot, _readable
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    _readable(ax, [2.00, 2.01, 1.99, 2.005])          # a 1 % wiggle
    lo, hi = ax.get_ylim()
    assert hi - lo >= 0.2 * 2.01                       # drawn as the wiggle it is
    _readable(ax, [1e-3] * 5, from_zero=True)          # a constant learning rate
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 1e-3
    plt.close(fig)
    data = [{"run_id": "r", "loss": [[1, 2.0], [2, 1.9]], "lr": [],
             "throughput": {"unit": "samples/s", "window_s": 10, "points": []}, "restarts": [],
             "resumed_from": None}]
    png = str(tmp_path / "p.png")
    plot(data, png)
    import matplotlib.image
    h, w = matplotlib.image.imread(png).shape[:2]
    assert h < 400   # one panel (loss), not three: nothing to draw for lr and samples/s


def test_a_script_jobs_report_reads_the_steps_it_printed(tmp_path):
    """A script that prints HF-style dicts: the report has its steps and its last loss, no `?`."""
    from launcher.record.runlog import RunPaths, read_run
    from launcher.view.report import figures, markdown
    logs = tmp_path / "logs" / "s-20261205-000000-abcd"
    logs.mkdir(parents=True)
    lines = [str({"loss": round(2.0 / i, 4), "learning_rate": 1e-4, "global_step/max_steps": f"{i}/3"})
             for i in (1, 2, 3)]
    (logs / "node0-localhost.log").write_text("starting\n" + "\n".join(lines) + "\n")
    run = read_run(RunPaths(logs.name, str(logs), None))
    assert [(s.step, s.loss) for s in run.steps] == [(1, 2.0), (2, 1.0), (3, 0.6667)]
    md = markdown(run, figures(run), None, "series.json")
    assert "| steps | 3 |" in md and "| final loss | 0.6667 (step 3) |" in md and "| ? " not in md, md


# ---- items 10 and 11: leftovers and the trainers' own rules ------------------------------------

@pytest.mark.parametrize("typo", ["slot=4", "SLOTS=4", "Slots=4"])
def test_a_hostfile_slots_typo_is_refused_not_read_past(tmp_path, typo):
    """DeepSpeed refuses the line; mlaunch read it past and ran 2 × gpus_per_node."""
    from launcher.errors import SpecError
    from launcher.spec import load_spec
    (tmp_path / "hostfile").write_text(f"node0 slots=4\nnode1 {typo}\n")
    spec = load_yaml(os.path.join(CORPUS, "qwen3_lora_sft.yaml"))
    spec["cluster"] = {"hostfile": "hostfile", "workdir": "/mnt/shared/work"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError) as err:
        load_spec(str(path))
    assert [str(p) for p in err.value.problems] == [
        f"{tmp_path}/hostfile:2: {typo!r}: did you mean slots=4? (DeepSpeed and OpenMPI "
        "read only `slots=`, lower case)"], err.value.problems


def test_example_configs_hold_no_secret_value(monkeypatch):
    import glob
    secretish = ("TOKEN", "KEY", "SECRET", "PASSWORD")
    for path in glob.glob(os.path.join(CONFIGS, "**", "*.yaml"), recursive=True):
        env = ((load_yaml(path) or {}).get("cluster") or {}).get("env") or {}
        for name, value in env.items():
            if any(s in name.upper() for s in secretish):
                assert value == "${" + name + "}", (path, name)   # taken from the shell, never written
    r = mlaunch("validate", os.path.join(CONFIGS, "seed000-qwen2-7b-lora.yaml"), env={"HF_TOKEN": ""})
    assert r.returncode == 0   # set (empty) in the shell: taken from it
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    import subprocess as sp
    r = sp.run([sys.executable, "-m", "launcher.cli", "validate", os.path.join(CONFIGS, "seed000-qwen2-7b-lora.yaml")],
               env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "export HF_TOKEN=… in the shell that runs mlaunch" in r.stderr, r.stderr


def test_a_relative_resume_path_says_where_it_was_looked_for():
    from types import SimpleNamespace
    from launcher.errors import UserError
    from launcher.nodeprog.checkpoints import Discovery, Skipped
    from launcher.runs.outputdir import _explicit
    from launcher.spec import load_spec
    job = load_spec(os.path.join(CORPUS, "qwen3_lora_sft.yaml"))
    master = SimpleNamespace(plan=SimpleNamespace(nodes=[SimpleNamespace(host="node0")]),
                             discover=lambda checkpoint: Discovery(None, None, (Skipped(checkpoint, checkpoint,
                                                                                        "no such directory"),), False))
    with pytest.raises(UserError) as err:
        _explicit(job, master, "checkpoint-4", None)
    assert str(err.value) == (
        "--resume checkpoint-4: no such directory on node0 node0, looked for relative to /mnt/shared/work, not "
        "output_dir; for the checkpoint of this job give --resume=saves/qwen3-4b/lora/sft/checkpoint-4; give a "
        "complete checkpoint, or --resume to take the latest complete one in saves/qwen3-4b/lora/sft")


def swift_problems(*overrides: str) -> list[str]:
    r = mlaunch("validate", os.path.join(CONFIGS, "seed003-qwen2.5-14b-swift-lora.yaml"), *overrides)
    return [ln.removeprefix("mlaunch: ").split(" (set by the override")[0] for ln in r.stderr.splitlines()[1:]]


def test_swift_start_rules_in_validate():
    assert swift_problems("passthrough.packing=true") == [
        "passthrough.packing: ms-swift's packing needs flash attention and the job has no attn_impl (sdpa or "
        "eager); add `attn_impl: flash_attn` to passthrough (flash-attn installed on the nodes), or remove packing"]
    assert swift_problems("passthrough.packing=true", "passthrough.attn_impl=flash_attn") == []
    assert swift_problems("stage=rlhf", "rlhf_type=grpo", "passthrough.num_generations=3") == [
        "passthrough.num_generations: num_generations 3 does not divide the generation batch 64 (per_device 1 × "
        "world 8 × grad_accum 8); ms-swift refuses it at start. Give num_generations one of [2, 4, 8, 16, 32, 64], "
        "or a batch it divides"]
    assert swift_problems("stage=rlhf", "rlhf_type=grpo") == []   # its default 8 divides 64
    assert swift_problems("report_to=tensorboard") == [
        "report_to: unknown key: for ms-swift it is one of its own arguments: write it under passthrough, e.g. "
        "`passthrough: {report_to: tensorboard}` (top-level report_to is LLaMA-Factory's)"]


@pytest.mark.training
def test_the_grpo_rule_is_swifts_own_arithmetic():
    """The same numbers through ms-swift's own argument mixin, where the swift venv is here."""
    from .training import require_swift
    python = require_swift()
    code = ("from swift.rlhf_trainers.args_mixin import GRPOArgumentsMixin as M\n"
            "class A(M):\n  pass\n"
            "a=A.__new__(A); a.num_generations=3; a.world_size=8; a.per_device_train_batch_size=1\n"
            "a.gradient_accumulation_steps=8; a.generation_batch_size=None; a.steps_per_generation=None\n"
            "try:\n  a._init_generation_batch_params(); print('ok')\nexcept ValueError as e:\n  print('refused', e)\n")
    r = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if "ImportError" in r.stderr or "cannot import" in r.stderr:
        pytest.skip(f"ms-swift's mixin has another name here: {r.stderr[-200:]}")
    assert r.stdout.startswith("refused generation_batch_size (64) must be evenly divisible by num_generations (3)"), \
        r.stdout + r.stderr[-2000:]


def test_stage_dpo_on_an_sft_dataset_is_refused_by_validate(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "dataset_info.json").write_text(json.dumps({
        "alpaca_demo": {"file_name": "a.json"}, "pairs": {"file_name": "p.json", "ranking": True,
                                                           "columns": {"chosen": "c", "rejected": "r"}}}))
    job = os.path.join(CORPUS, "qwen3_lora_sft.yaml")
    r = mlaunch("validate", job, f"dataset_dir={data}", "dataset=alpaca_demo", "stage=dpo")
    assert r.returncode == 2 and (
        f"mlaunch: dataset: alpaca_demo: stage dpo needs a preference dataset (ranking: true, with chosen/rejected) "
        f"({data}/dataset_info.json); pick a dataset of that form, or the stage its form trains") in r.stderr, r.stderr
    assert mlaunch("validate", job, f"dataset_dir={data}", "dataset=pairs", "stage=dpo").returncode == 0
    r = mlaunch("validate", job, f"dataset_dir={data}", "dataset=pairs")
    assert r.returncode == 2 and "a ranking dataset (ranking: true) cannot train stage sft" in r.stderr


def test_lora_dropout_defaults_to_each_trainers_own():
    from launcher.spec import Job
    from pydantic import TypeAdapter
    schema = TypeAdapter(Job).json_schema(by_alias=True)
    field = schema["$defs"]["Finetuning"]["properties"]["lora_dropout"]
    assert field["default"] is None and "ms-swift 0.05" in field["description"]
    r = mlaunch("submit", os.path.join(CORPUS, "qwen3_lora_sft.yaml"), "--dry-run", "--full")
    assert "lora_dropout: 0.0" in r.stdout, r.stdout[-2000:]
    r = mlaunch("submit", os.path.join(CONFIGS, "seed003-qwen2.5-14b-swift-lora.yaml"), "--dry-run", "--full")
    assert "--lora_dropout 0.05" in " ".join(r.stdout.split()), r.stdout[-2000:]


def test_fsdp_prefetch_and_ram_efficient_loading_are_rendered():
    r = mlaunch("submit", os.path.join(CORPUS, "qwen3_lora_sft.yaml"), "--dry-run", "--full",
                "fsdp={sharding: full_shard, backward_prefetch: backward_pre, cpu_ram_efficient_loading: true}")
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("fsdp_config:"))
    assert json.loads(line.split(":", 1)[1]) == {"use_orig_params": True, "backward_prefetch": "backward_pre",
                                                  "cpu_ram_efficient_loading": True}, line


def test_init_keeps_the_fsdp_examples_settings(tmp_path):
    lf = dict(example("qwen3_lora_sft"), fsdp="full_shard auto_wrap",
              fsdp_config={"backward_prefetch": "BACKWARD_PRE", "cpu_ram_efficient_loading": True,
                           "transformer_layer_cls_to_wrap": "Qwen3DecoderLayer"})
    path = tmp_path / "lf.yaml"
    path.write_text(yaml.safe_dump(lf))
    r = mlaunch("init", "--from-llamafactory", str(path), "--hosts", "a,b", "--gpus-per-node", "8", "--workdir", "/w")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["fsdp"] == {"sharding": "full_shard", "auto_wrap": True, "offload": False,
                                                "layer_cls": ["Qwen3DecoderLayer"], "backward_prefetch": "backward_pre",
                                                "cpu_ram_efficient_loading": True}


@pytest.mark.training
def test_check_says_a_liger_kernel_the_nodes_lack(tmp_path):
    """LLaMA-Factory imports liger_kernel at start when enable_liger_kernel is on: `check` names the package."""
    from .training import require_trainer
    python = require_trainer()
    probe = subprocess.run([python, "-c", "import importlib.util as u; print(bool(u.find_spec('liger_kernel')))"],
                           capture_output=True, text=True)
    if probe.stdout.strip() != "False":
        pytest.skip("liger_kernel is installed in the trainer venv here")
    spec = load_yaml(os.path.join(CONFIGS, "quickstart.yaml"))
    spec["cluster"]["python"] = python
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = mlaunch("check", str(path), "passthrough.enable_liger_kernel=true", env={"MLAUNCH_HOME": str(tmp_path / "h")})
    assert r.returncode == 1
    assert ("✗ software/python on node0 localhost: passthrough enable_liger_kernel: true needs liger-kernel, not "
            "installed (LLaMA-Factory would stop at start on every rank)") in r.stdout, r.stdout
    assert f"fix: {python} -m pip install liger-kernel, or turn the option off" in r.stdout


@pytest.mark.multihost
def test_slurms_own_kill_is_not_called_mlaunchs(slurm2, tmp_path):
    """Node 1's rank exits 3; srun's --kill-on-bad-exit ends node 0's: the node table says srun did."""
    from .slurmjobs import slurm_script_job, submit
    spec = slurm_script_job(tmp_path, "fail_or_sleep.py", ["1", "3", "2"], nproc=1)
    r = submit(slurm2, tmp_path, spec)
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr
    assert re.search(r"^\[mlaunch\] 1 +\S+ +exit 3$", r.stdout, re.M), r.stdout[-2000:]
    assert re.search(r"^\[mlaunch\] 0 +\S+ +terminated by srun \(--kill-on-bad-exit after node1 failed\)",
                     r.stdout, re.M), r.stdout[-2000:]
    assert "terminated by mlaunch" not in r.stdout


def test_a_node_mlaunch_ended_still_says_mlaunch():
    from launcher.session.outcome import NodeOutcome
    from launcher.transport.base import Exit
    assert NodeOutcome(0, "a", Exit(143), terminated=True).result == "terminated by mlaunch (exit 143)"


def test_a_submit_refused_for_checkpoints_in_output_dir_is_no_run(tmp_path):
    """Checkpoints exist: refused after the record was opened (the connect, the look at output_dir);
    no row, so `ps lf` and `report lf` never pick it (they said "log dir ... does not exist")."""
    from .helpers import write_spec
    from .test_resume_guard import checkpoint, lf_job
    out = tmp_path / "out"
    checkpoint(out, 5)
    env = {"MLAUNCH_HOME": str(tmp_path / "home")}
    r = mlaunch("submit", write_spec(tmp_path, lf_job(tmp_path, str(out))), "--no-preflight", env=env)
    assert r.returncode == 2 and "already holds checkpoints" in r.stderr, r.stderr
    assert json.loads(mlaunch("ps", "--all", "--json", env=env).stdout) == []
    for cmd in ("ps", "report", "logs"):
        got = mlaunch(cmd, "lf", env=env)
        assert got.returncode == 2 and "does not exist" not in got.stderr, (cmd, got.stderr)


SWIFT_CORPUS = os.path.join(CONFIGS, "swift-examples")


def swift_examples() -> dict:
    return json.load(open(os.path.join(SWIFT_CORPUS, "examples.json"), encoding="utf-8"))


# multi-node-accelerate's ZeRO-3 is in accelerate's config file, not on its command line.
@pytest.mark.parametrize("name", sorted(n for n, e in swift_examples().items()
                                        if e["entry"].startswith("swift.") and n != "multi-node-accelerate"))
def test_init_from_swift_writes_the_corpus_spec(name):
    """Each ms-swift example's command line, given to init, becomes the spec the swift corpus
    holds for it (checked against ms-swift's own parser in test_swift_examples)."""
    import shlex
    from launcher.spec import validate
    example = swift_examples()[name]
    want = load_yaml(os.path.join(SWIFT_CORPUS, f"{name}.yaml"))
    cmd = example["entry"].replace(".", " ") + " " + shlex.join(example["argv"])
    r = mlaunch("init", "--from-swift", cmd, "--hosts", ",".join(want["cluster"]["hosts"]),
                "--gpus-per-node", str(want["cluster"]["gpus_per_node"]), "--workdir", "/data/work")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    got = yaml.safe_load(r.stdout)
    same = lambda spec: validate(spec).model_dump(by_alias=True, exclude={"name", "cluster"})  # noqa: E731
    assert same(got) == same(want)


def test_init_from_swift_refuses_what_it_does_not_convert():
    r = mlaunch("init", "--from-swift", "megatron sft --model m --dataset d", "--hosts", "a", "--gpus-per-node", "8")
    assert r.returncode == 2 and "Megatron-SWIFT command lines are not converted (yet)" in r.stderr
    r = mlaunch("init", "--from-swift", "python train.py", "--hosts", "a", "--gpus-per-node", "8")
    assert r.returncode == 2 and "not an ms-swift command line" in r.stderr

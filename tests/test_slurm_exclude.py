"""Issue 29, the Slurm variant: a restart after a node failure excludes the failed node, and
asks for fewer nodes (--nodes, within cluster.min_nodes) when the exclusions leave too few."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from launcher.errors import UserError
from launcher.transport.base import Exit
from launcher.session.outcome import JobResult, NodeOutcome
from launcher.backends.slurm import exclude as slurm_exclude
from launcher.spec import validate

from .helpers import plan_of, CONFIGS, ROOT, SCRIPTS, limit, load_yaml, write_spec
from .slurmjobs import baseline, drain_and_kill, leftovers, slurm_cluster, slurm_script_job


class _Say:
    def __init__(self):
        self.lines: list[str] = []

    def say(self, line: str) -> None:
        self.lines.append(line)


class _Events:
    def __init__(self):
        self.got: list[tuple] = []

    def emit(self, event: str, **fields) -> None:
        self.got.append((event, fields))


def show(plan) -> str:
    """The dry-run text of a Slurm plan, as its backend shows it."""
    from launcher.backends import backend_of
    return backend_of(plan.job).show(plan)


def _job(tmp_path, **slurm):
    spec = slurm_script_job(tmp_path, "allreduce.py", [])
    spec["cluster"]["slurm"] |= slurm
    return validate(spec | {"max_restarts": 2})


def test_dry_run_says_a_restart_excludes_the_failed_nodes(tmp_path):
    text = show(plan_of(_job(tmp_path), run_id="r"))
    assert ("restarts under slurm: each is a new sbatch job; a restart excludes the nodes that "
            "failed (drained, down or failing in scontrol, or a lost task): --exclude, "
            "accumulated across attempts") in text, text


def test_exclusions_join_the_users_and_accumulate(tmp_path, monkeypatch):
    states = {"a": {}, "b": {"b": "Slurm state IDLE+DRAIN: test"}}
    job = _job(tmp_path, extra_sbatch={"exclude": "z"})
    say, events = _Say(), _Events()
    for attempt, hosts in enumerate([("a", "b"), ("a", "c")]):
        monkeypatch.setattr(slurm_exclude, "failed_nodes", lambda names: {
            n: why for n in names for why in [states.get(n, {}).get(n)] if why})
        lost = attempt == 1   # the second attempt loses c's task
        result = JobResult(code=1, nodes=[
            NodeOutcome(0, hosts[0], exit=Exit(1)),
            NodeOutcome(1, hosts[1], exit=Exit(143, lost=lost, detail="Killed"))])
        job = slurm_exclude.exclude_failed(job, result, say, events)
    assert job.cluster.slurm.extra_sbatch["exclude"] == "z,b,c"
    assert say.lines == ["slurm: the restart excludes b (Slurm state IDLE+DRAIN: test)",
                         "slurm: the restart excludes c (task lost (Killed))"]
    assert [e[1]["host"] for e in events.got] == ["b", "c"]
    plan = plan_of(job, run_id="r", attempt=2)
    from launcher.backends.slurm import sbatch
    assert "#SBATCH --exclude=z,b,c\n" in sbatch.request(plan).script


def _lora(nodes=3, min_nodes=2, **batch) -> dict:
    """The Slurm LoRA example without DeepSpeed: `nodes` × 2 processes, global 12 at 3 nodes."""
    data = load_yaml(os.path.join(CONFIGS, "slurm", "qwen2-7b-lora.yaml"))
    data["cluster"]["slurm"]["nodes"] = nodes
    data["cluster"]["gpus_per_node"] = 2
    data["cluster"]["slurm"]["extra_sbatch"]["gres"] = "gpu:2"
    data["cluster"]["min_nodes"] = min_nodes
    del data["deepspeed"]
    data["batch"] = {"per_device": 1, "grad_accum": 2, "global": nodes * 2 * 2} | batch
    return data


def _fit(monkeypatch, job, usable, exclude="b"):
    """slurm_exclude.fit against a partition whose usable nodes are `usable`."""
    monkeypatch.setattr(slurm_exclude, "hostnames", lambda spec: spec.split(","))
    seen = []
    monkeypatch.setattr(slurm_exclude, "usable_nodes",
                        lambda part, excl: seen.append((part, excl)) or (part, usable))
    slurm = job.cluster.slurm.model_copy(update={"extra_sbatch": {"exclude": exclude}})
    job = job.model_copy(update={"cluster": job.cluster.model_copy(update={"slurm": slurm})})
    say, events = _Say(), _Events()
    new = slurm_exclude.fit(job, say, events)
    assert seen == [("gpu", exclude.split(","))]
    return new, say.lines, events.got


def test_slurm_shrink_asks_for_fewer_nodes_and_keeps_the_global_batch(monkeypatch):
    job = validate(_lora())
    new, lines, got = _fit(monkeypatch, job, ["a", "c"])
    assert new.cluster.slurm.nodes == 2 and new.batch.grad_accum == 3
    assert lines == ["shrink: excluded b, which leaves 2 usable node(s) of the 3 asked in "
                     "partition gpu; the next attempt runs on 2 nodes, world 6 -> 4 processes, "
                     "grad_accum 2 -> 3, global batch 12 = 4 × 1 per device × 3 (kept)"]
    assert got == [("shrink", {"old_world": 6, "new_world": 4, "nodes": 2, "old_grad_accum": 2,
                               "new_grad_accum": 3, "global_batch": 12, "lost": "b"})]
    from launcher.backends.slurm import sbatch
    plan = plan_of(new, run_id="r", attempt=1)
    script = sbatch.request(plan).script
    assert "#SBATCH --nodes=2\n" in script and "#SBATCH --exclude=b\n" in script, script
    assert "srun --nodes=2 --ntasks=2 " in script, script
    yaml = next(f.content for f in plan.files if f.path.endswith(".yaml"))
    assert re.search(r"^gradient_accumulation_steps: 3$", yaml, re.M), yaml
    assert re.search(r"^per_device_train_batch_size: 1$", yaml, re.M), yaml


def test_slurm_shrink_only_when_too_few_and_never_below_min_nodes(monkeypatch):
    job = validate(_lora())
    same, lines, got = _fit(monkeypatch, job, ["a", "c", "d"])   # a spare node in the partition
    assert same is not None and same.cluster.slurm.nodes == 3 and not lines and not got
    with pytest.raises(UserError) as err:
        _fit(monkeypatch, job, ["a"], exclude="b,c")
    assert err.value.lines() == ["cluster.min_nodes: 2: excluded b, c, which leaves 1 usable "
                                 "node(s) of the 3 asked in partition gpu; the run ends"]
    odd = validate(_lora(per_device=2, grad_accum=1))   # global 12 over worlds 6 and 4: 4 × 2 misses it
    with pytest.raises(UserError) as err:
        _fit(monkeypatch, odd, ["a", "c"])
    assert err.value.lines() == [
        "excluded b, which leaves 2 usable node(s) of the 3 asked in partition gpu: cannot shrink "
        "to 2 nodes: the global batch 12 is not a multiple of world 4 × per_device 2 = 8 "
        "(per_device is never raised); node counts that keep it: 3; give a batch.global that "
        "they divide, or a cluster.min_nodes that avoids it; the run ends"]
    full = validate(_lora(min_nodes=3))
    assert slurm_exclude.fit(full, _Say(), _Events()) is full   # no shrink allowed: no sinfo


def test_usable_nodes_reads_the_partition_from_sinfo(monkeypatch):
    from launcher.backends.slurm import commands as slurm
    rows = ("a|gpu*|idle\nb|gpu*|drained\nc|gpu*|allocated\nd|gpu*|idle*\ne|gpu*|mixed\n"
            "f|gpu*|down\ng|cpu|idle\nh|gpu*|draining\n")
    monkeypatch.setattr(slurm, "slurm_cmd", lambda argv, timeout=30: subprocess.CompletedProcess(
        argv, 0, rows, ""))
    assert slurm.usable_nodes(None, ["e"]) == ("gpu", ["a", "c"])
    assert slurm.usable_nodes("cpu", []) == ("cpu", ["g"])
    monkeypatch.setattr(slurm, "slurm_cmd", lambda argv, timeout=30: subprocess.CompletedProcess(
        argv, 1, "", "sinfo: error"))
    assert slurm.usable_nodes(None, []) is None

    def hangs(*args, **kw):
        raise subprocess.TimeoutExpired(args[0], kw.get("timeout"))
    monkeypatch.setattr(slurm.subprocess, "run", hangs)   # slurmctld not answering: no traceback
    assert slurm.usable_nodes(None, []) is None


def test_slurm_commands_that_hang_or_are_missing_are_failures_not_tracebacks(monkeypatch):
    """Every Slurm client call goes through slurm_cmd: a hung slurmctld (timeout) or a missing
    binary is its exit code, and each caller reads it as 'could not tell', never as 'gone'."""
    from launcher.backends.slurm import commands as slurm

    def hangs(*args, **kw):
        raise subprocess.TimeoutExpired(args[0], kw.get("timeout"))
    monkeypatch.setattr(slurm.subprocess, "run", hangs)
    r = slurm.slurm_cmd(["scontrol", "ping"], timeout=3)
    assert (r.returncode, r.stderr) == (124, "scontrol: no answer in 3 s (is slurmctld up?)")
    assert slurm.hostnames("n[0-1]") == []
    assert slurm.failed_nodes(["n0", "n1"]) == {}
    info = slurm.job_info("7")
    assert info["JobState"] == "UNANSWERED" and not slurm.is_gone(info)   # may still run
    assert slurm.cancel_and_wait("7", timeout=0.3) is False   # never claims the job left

    def missing(*args, **kw):
        raise FileNotFoundError(2, "No such file or directory")
    monkeypatch.setattr(slurm.subprocess, "run", missing)
    r = slurm.slurm_cmd(["sinfo"])
    assert (r.returncode, r.stderr) == (127, "sinfo: No such file or directory")
    assert not slurm.is_gone(slurm.job_info("7"))
    assert slurm.usable_nodes(None, []) is None and slurm.hostnames("n0") == []


def test_slurm_dry_run_shows_the_shrink_and_zero_nvme_offload_is_refused():
    job = validate(_lora() | {"max_restarts": 1})
    text = show(plan_of(job, run_id="r"))
    got = [ln for ln in text.splitlines() if ln.startswith(("elastic shrink", "  at "))]
    assert got == [
        "elastic shrink: down to 2 nodes (cluster.min_nodes), world 4: when the excluded nodes "
        "leave fewer usable nodes in the partition, the restart job asks for fewer (sbatch --nodes)",
        "  at 3 nodes: global batch 12 = world 6 × 1 per device × 2 accumulation",
        "  at 2 nodes: global batch 12 = world 4 × 1 per device × 3 accumulation"], text
    from launcher.errors import SpecError
    validate(_lora() | {"deepspeed": {"stage": 2}})   # converted in a one-node Slurm job
    validate(_lora() | {"deepspeed": {"stage": 2, "offload_optimizer": "cpu"}})
    with pytest.raises(SpecError) as err:
        validate(_lora() | {"deepspeed": {"stage": 2, "offload_optimizer": "nvme", "nvme_path": "/nvme"}})
    assert [str(p) for p in err.value.problems][0].startswith(
        "cluster.min_nodes: 2: a DeepSpeed checkpoint holds one optimizer shard per rank")
    with pytest.raises(SpecError) as err:
        validate(_lora(min_nodes=4))
    assert [str(p) for p in err.value.problems] == [
        "cluster.min_nodes: 4 is more than the 3 nodes of cluster.slurm.nodes; give at most 3, "
        "or leave it out"]


def test_slurm_universal_conversion_is_a_one_node_job_of_its_own(tmp_path):
    """Under Slurm no node is held between attempts: the conversion is `srun --nodes=1
    --ntasks=1` with the job's partition, account and exclusions, and says so."""
    from launcher.runs import universal
    from launcher.backends.slurm import sbatch
    job = validate(_lora() | {"deepspeed": {"stage": 2}, "max_restarts": 1})
    slurm = job.cluster.slurm.model_copy(update={"extra_sbatch": {"exclude": "b", "gres": "gpu:2"},
                                                 "account": "ml"})
    job = job.model_copy(update={"cluster": job.cluster.model_copy(update={"slurm": slurm})})
    plan = plan_of(job, run_id="r", attempt=1)
    argv = sbatch.step_argv(plan, "universal")   # the script goes on stdin, never in argv
    assert argv == ["srun", "--nodes=1", "--ntasks=1", "--job-name=r+a1-universal", "--partition=gpu",
                    "--account=ml", "--time=2-00:00:00", "--exclude=b", "/bin/sh", "-s"], argv
    ck = tmp_path / "checkpoint-3"
    ck.mkdir()

    class Steps:
        got: list = []

        def run_step(self, plan, name, script, timeout):
            self.got.append((name, script))
            return 0, "mlaunch-universal converted 6\n"

        def run(self, host, script, timeout):   # the look on the login node: no DeepSpeed tag here
            return 0, "mlaunch-saved ?\n"
    say, steps = _Say(), Steps()
    assert universal.prepare(job, plan, steps, str(ck), say, _Events()) is True
    assert [n for n, _ in steps.got] == ["universal"] and str(ck) in steps.got[0][1]
    assert say.lines == [f"resume: {ck} was saved at world 6; converted to DeepSpeed's universal "
                         "checkpoint on a one-node Slurm job (srun) (ds_to_universal), loaded at "
                         "world 6 (checkpoint.load_universal)"]


def _standin_lf(tmp_path, out) -> dict:
    """3 nodes × 1 process, min_nodes 2, global batch 6; llamafactory.launcher is the stand-in
    of tests/scripts/lf_standin (it prints the batch the rendered YAML gives each rank)."""
    cluster = slurm_cluster(tmp_path, nproc=1, nodes=3) | {
        "min_nodes": 2, "env": {"PYTHONPATH": os.path.join(SCRIPTS, "lf_standin")}}
    return {"name": "t", "trainer": "llamafactory", "cluster": cluster,
            "model": str(tmp_path / "model"), "template": "qwen", "dataset": "d",
            "dataset_dir": str(tmp_path / "data"), "finetuning": {"type": "lora"},
            "batch": {"per_device": 1, "grad_accum": 2, "global": 6},
            "training": {"max_steps": 4, "learning_rate": 1.0e-4}, "output_dir": str(out),
            "max_restarts": 1, "restart_backoff_s": 1}


@pytest.mark.multihost
def test_drained_node_is_excluded_and_the_restart_job_shrinks(slurm3, tmp_path):
    """A 3-node job (min_nodes 2) on the 3-node cluster: node 1 is drained and its rank killed;
    the restart sbatch excludes it, asks for --nodes=2 and trains with grad_accum 3: the same
    global batch 6, on the two other nodes."""
    keep = baseline(slurm3)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "SLURM_CONF": slurm3.conf}
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", "--no-preflight",
                             write_spec(tmp_path, _standin_lf(tmp_path, out))],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen, said = [], 0
    for line in proc.stdout:
        seen.append(line)
        said += "] batch rank" in line
        if said == 3:
            break
    first = re.search(r"slurm job (\d+) running on (\S+), (\S+), (\S+)\n", "".join(seen))
    assert first, "".join(seen)
    lost = first.group(3)   # node 1 of the first attempt: drained, then its task killed
    drain_and_kill(slurm3, lost)
    rest, _ = proc.communicate(timeout=limit(300))
    console = "".join(seen) + rest
    assert proc.returncode == 0, console[-4000:]
    assert re.search(rf"slurm: the restart excludes {lost} \(Slurm state \S*DRAIN\S*: test\)", console), console
    assert (f"shrink: excluded {lost}, which leaves 2 usable node(s) of the 3 asked in partition "
            "debug; the next attempt runs on 2 nodes, world 3 -> 2 processes, grad_accum 2 -> 3, "
            "global batch 6 = 2 × 1 per device × 3 (kept)") in console, console
    jobs = re.findall(r"slurm job (\d+): (\d) nodes requested; batch script (\S+)", console)
    assert [n for _, n, _ in jobs] == ["3", "2"], console
    assert "--exclude" not in open(jobs[0][2]).read()
    script = open(jobs[1][2]).read()
    assert f"#SBATCH --exclude={lost}\n" in script and "#SBATCH --nodes=2\n" in script, script
    info = slurm3.run(["scontrol", "show", "job", "-o", jobs[1][0]]).stdout
    assert f"ExcNodeList={lost} " in info and " NumNodes=2 " in info, info
    others = sorted(h.name for h in slurm3.hs.hosts if h.name != lost)
    second = re.search(rf"slurm job {jobs[1][0]} running on (\S+), (\S+)\n", console)
    assert second and sorted(second.groups()) == others, console
    batches = sorted(re.findall(r"batch rank (\d)/(\d) host (\S+) attempt (\d): global (\d+) = (.*)", console))
    assert [b for b in batches if b[3] == "0"] == [
        (str(r), "3", h, "0", "6", "3 × 1 × 2") for r, h in enumerate(first.groups()[1:])], console
    assert sorted((b[2], b[4], b[5]) for b in batches if b[3] == "1") == [
        (h, "6", "2 × 1 × 3") for h in others], console
    done = sorted(open(p).read() for p in out.glob("done-rank*-attempt1"))
    assert done == others, done
    events = [json.loads(ln) for p in (out / "logs").glob("*/events.jsonl") for ln in open(p)]
    assert [(e["host"], e["reason"]) for e in events if e["event"] == "node_excluded"] == [
        (lost, re.search(rf"\(({re.escape('Slurm state')}[^)]*)\)", console).group(1))]
    (shrunk,) = [e for e in events if e["event"] == "shrink"]
    assert (shrunk["attempt"], shrunk["nodes"], shrunk["old_world"], shrunk["new_world"],
            shrunk["new_grad_accum"], shrunk["global_batch"], shrunk["lost"]) == (1, 2, 3, 2, 3, 6, lost)
    assert leftovers(slurm3, keep) == {h.name: set() for h in slurm3.hs.hosts}
    assert slurm3.run(["squeue", "-h"]).stdout.strip() == ""


def test_check_allocates_with_the_batch_scripts_options_and_steps_overlap_in_it():
    """`mlaunch check` under Slurm: salloc takes the options sbatch gets (an extra_sbatch key
    may be written with or without its dashes, as in the batch script), and each probe is an
    overlapping one-node step of that allocation (templates/slurm_salloc.j2, slurm_overlap.j2)."""
    from launcher.backends.slurm.alloc import AllocationExecutor, salloc_argv
    job = validate(_lora())
    slurm = job.cluster.slurm.model_copy(update={"extra_sbatch": {"--gres": "gpu:2", "mail-type": "END"},
                                                 "account": "ml"})
    job = job.model_copy(update={"cluster": job.cluster.model_copy(update={"slurm": slurm})})
    assert salloc_argv(job) == ["salloc", "--no-shell", "--nodes=3", "--ntasks-per-node=1",
                                f"--job-name={job.name}-check", "--partition=gpu", "--account=ml",
                                "--time=2-00:00:00", "--exclusive", "--gres=gpu:2", "--mail-type=END"]
    ex = AllocationExecutor(job, "/nonexistent")
    ex.job_id = "41"
    assert ex._srun("n2") == ["srun", "--jobid=41", "--nodelist=n2", "--nodes=1", "--ntasks=1",
                              "--overlap", "--unbuffered", "--quiet"]

"""cluster.spare_hosts and cluster.min_nodes (issue 29, the spare-host half): the refusals, the
dry-run's policy line, the replacement choice, and a lost node replaced on namespace hosts."""
from __future__ import annotations

import copy
import glob
import json
import os
import re
import pytest

from launcher.errors import SpecError, UserError
from launcher.transport.base import Exit
from launcher.session.outcome import JobResult, NodeOutcome
from launcher.runs import spares
from launcher.spec import load_spec, validate
from launcher.view.present import describe_plan

from .helpers import plan_of, TRANSPORT, CONFIGS, limit, load_yaml, script_job, set_path

def spec(**cluster) -> dict:
    return {"name": "t", "trainer": "script", "script": {"path": "/abs/train.py"},
            "cluster": {"hosts": ["a", "b"], "gpus_per_node": 1, **cluster}}


def problems(data: dict) -> list[str]:
    with pytest.raises(SpecError) as err:
        validate(data)
    return [str(p) for p in err.value.problems]


@pytest.mark.parametrize("cluster, line", [
    ({"min_nodes": 3}, "cluster.min_nodes: 3 is more than the 2 nodes of cluster.hosts; give at "
                       "most 2, or leave it out"),
    ({"spare_hosts": ["B"]}, "cluster.spare_hosts[0]: 'B' is already cluster.hosts[1]; a spare "
                             "must be a machine the job does not use; remove it or name another"),
    ({"spare_hosts": ["c", "root@c"]}, "cluster.spare_hosts[1]: 'root@c' is also "
                                       "cluster.spare_hosts[0]; list each spare once"),
    ({"spare_hosts": ["c d"]}, "cluster.spare_hosts[0]: 'c d' is not a host name or address; "
                               "give host, user@host, host:port, user@host:port or [v6addr]:port"),
    ({"spare_hosts": ["c"], "gpus_per_node": [2, 1]},
     "cluster.gpus_per_node: [2, 1]: a spare may take any node's place, so every node must run "
     "the same count; give one count, or remove spare_hosts"),
    ({"spare_hosts": ["c"], "cuda_visible_devices": [[0], [1]]},
     "cluster.cuda_visible_devices: one list per node ([[0], [1]]) with spare_hosts: a spare may "
     "take any node's place; give one list for every node, or remove spare_hosts"),
])
def test_spare_refusals(cluster, line):
    assert problems(spec(**cluster)) == [line]


def test_min_nodes_zero_is_pydantic_refusal():
    got = problems(spec(min_nodes=0))
    assert len(got) == 1 and got[0].startswith("cluster.min_nodes: 0"), got


def test_spares_with_a_hostfile_of_mixed_slots_refused(tmp_path):
    (tmp_path / "hosts").write_text("a slots=2\nb slots=1\n")
    data = spec(spare_hosts=["c"])
    del data["cluster"]["hosts"], data["cluster"]["gpus_per_node"]
    data["cluster"]["hostfile"] = "hosts"
    path = tmp_path / "job.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SpecError) as err:
        load_spec(str(path))
    assert [str(p) for p in err.value.problems] == [
        "cluster.gpus_per_node: [2, 1] (the hostfile's slots= differ between hosts): a spare may "
        "take any node's place, so every node must run the same count; give one count, or remove "
        "spare_hosts"]


def test_spares_under_slurm_refused():
    data = copy.deepcopy(load_yaml(os.path.join(CONFIGS, "slurm", "qwen2-7b-lora.yaml")))
    data = set_path(data, "cluster.spare_hosts", ["n9"])
    assert problems(data) == [
        "cluster.spare_hosts: Slurm picks the nodes, so there are no spares under Slurm (a "
        "restart excludes the nodes that failed by itself); remove spare_hosts, or use "
        "scheduler: ssh with hosts"]


def test_min_nodes_equal_to_the_nodes_and_spares_accepted_and_shown():
    job = validate(spec(min_nodes=2, spare_hosts=["c", "d"]) | {"max_restarts": 1})
    text = describe_plan(plan_of(job, run_id="r"))
    assert ("spare hosts, in order: c, d: before a restart each node lost in the last attempt "
            "(connection lost or a hardware-looking error), unreachable now, or failing the host "
            "check (GPU, disk) takes the next one, with its rank; the world (2) stays the same; a "
            "replaced node 0's spare becomes the master") in text, text


def test_lora_dry_run_says_the_global_batch_stays():
    data = copy.deepcopy(load_yaml(os.path.join(CONFIGS, "slurm", "qwen2-7b-lora.yaml")))
    c = data["cluster"]
    for k in ("scheduler", "slurm", "shared_dir"):
        c.pop(k, None)
    c["hosts"], c["spare_hosts"] = [f"n{i}" for i in range(4)], ["n8"]
    job = validate(data)
    line = next(ln for ln in describe_plan(plan_of(job, run_id="r")).splitlines()
                if ln.startswith("spare hosts"))
    assert re.search(r"the world \(\d+\) and the global batch \(\d+\) stay the same", line), line


class Events:
    def __init__(self):
        self.seen = []

    def emit(self, event, **kw):
        self.seen.append((event, kw))


class Said:
    def __init__(self):
        self.lines = []

    def say(self, line):
        self.lines.append(line)


def lost_result(*lost: int) -> JobResult:
    nodes = [NodeOutcome(r, h, Exit(255, lost=True, detail="connection lost") if r in lost
                         else Exit(143), terminated=r not in lost) for r, h in enumerate("ab")]
    return JobResult(255, nodes, first_failure=lost[0])


def test_lost_ranks_are_the_dropped_not_the_torn_down():
    r = lost_result(1)
    r.nodes.append(NodeOutcome(2, "x", Exit(255, lost=True, detail="connection lost"), terminated=True))
    r.nodes.append(NodeOutcome(3, "y", Exit(1)))
    assert spares.lost_ranks(r) == {1: "connection lost"}


def test_node0_replaced_only_without_a_given_master_addr():
    job = validate(spec(spare_hosts=["c"], master_addr="a"))
    plan = plan_of(job, run_id="r")
    with pytest.raises(UserError) as err:
        spares._replace(job, plan, {0: "connection lost"}, Said(), Events())
    assert err.value.lines() == [
        "cluster.master_addr: a is node 0 (a), which is lost (connection lost); a spare cannot "
        "take node 0's place while master_addr names it: leave master_addr out (it follows node "
        "0) and submit again"]
    job = validate(spec(spare_hosts=["c", "d"]))
    said, ev = Said(), Events()
    new = spares._replace(job, plan, {0: "connection lost"}, said, ev)
    assert new.cluster.hosts == ["c", "b"] and new.cluster.spare_hosts == ["d"]
    assert "--master-addr" in (argv := plan_of(new, run_id="r").nodes[1].argv)
    assert argv[argv.index("--master-addr") + 1] == "c"
    assert ev.seen == [("host_replaced", {"rank": 0, "old_host": "a", "new_host": "c",
                                          "reason": "connection lost", "spares_left": 1})]
    assert said.lines == ["host replaced: node0 a -> spare c (connection lost); the world stays "
                          "2 processes; node 0 is the new master"]


def gpu_bin(tmp_path) -> str:
    """cluster.python whose bin directory has tests/scripts/fake_gpu_smi.sh as nvidia-smi:
    one idle GPU per host, a failed driver on a host with a broken-<hostname> file there."""
    from .helpers import python_with_smi
    return python_with_smi(tmp_path, "fake_gpu_smi.sh")


def test_lost_node_replaced_by_the_spare(make_hostset, tmp_path):
    """2 nodes + 2 spares, max_restarts 1, one (fake) GPU per host: node 1's link is cut
    mid-run; the first spare's GPU driver has failed, so the restart's host check replaces it
    by the second; the restart runs there, with node 1's rank and the same world, and exits 0."""
    from .test_fanout import node_logs, start, wait_ready
    with make_hostset(4) as hs:
        a, b, broken, spare = hs.hosts
        out = str(tmp_path / "out")
        os.makedirs(out)
        python = gpu_bin(tmp_path)
        (tmp_path / "bin" / f"broken-{broken.name}").write_text("")
        job = script_job([a.ip, b.ip], 1, "spare_job.py", [out], out, hs=hs, hangup_after_s=6,
                         python=python, spare_hosts=[broken.ip, spare.ip]) | {
            "max_restarts": 1, "restart_backoff_s": 0}
        proc = start(tmp_path, job)
        assert len(wait_ready(proc, 2, deadline_s=240)) == 2
        b.link_down()
        rest = proc.communicate(timeout=limit(240))[0]
        assert proc.returncode == 0, rest[-4000:]
        cut = ("connection lost: not responding (no answer to ssh keepalives in 6 s: the machine "
               "is frozen, or its link is down)")
        assert (f"host replaced: node1 {b.ip} -> spare {broken.ip} ({cut}); the world "
                "stays 2 processes") in rest, rest[-4000:]
        driver = ("health check: gpu: nvidia-smi failed: NVIDIA-SMI has failed because it "
                  "couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA "
                  "driver is installed and running.")
        assert (f"host replaced: node1 {broken.ip} -> spare {spare.ip} ({driver}); the world "
                "stays 2 processes") in rest, rest[-4000:]
        assert re.search(rf"^\[node1 {re.escape(spare.ip)} local0\] where rank 1/2 node 1 host "
                         rf"{spare.name} attempt 1$", rest, re.M), rest[-4000:]
        assert sorted(os.listdir(out)) == ["done-rank0-attempt1", "done-rank1-attempt1", "logs"]
        assert open(os.path.join(out, "done-rank1-attempt1")).read() == spare.name
        logs = node_logs(out)
        safe = spare.ip.replace(":", "_")
        assert f"where rank 1/2 node 1 host {spare.name} attempt 1" in logs[f"node1-{safe}.attempt1.log"]
        (path,) = glob.glob(f"{out}/logs/*/events.jsonl")
        events = [json.loads(ln) for ln in open(path)]
        replaced = [e for e in events if e["event"] == "host_replaced"]
        assert [(e["attempt"], e["rank"], e["old_host"], e["new_host"], e["reason"], e["spares_left"])
                for e in replaced] == [(1, 1, b.ip, broken.ip, cut, 1),
                                       (1, 1, broken.ip, spare.ip, driver, 0)]
        assert events[-1]["event"] == "run_end" and events[-1]["code"] == 0


class FakeExecutor:
    """Connects to every login but those in `down` (each a connect problem, as SSHExecutor's)."""

    def __init__(self, logins, down):
        self.logins, self.down, self.closed = logins, down, False

    def connect(self):
        from launcher.errors import Problem
        return [Problem(f"host {h}", "connection timed out") for h in self.logins if h in self.down]

    def close(self):
        self.closed = True


def test_unreachable_spare_skipped_and_no_spare_left_refused(monkeypatch):
    down = {"c"}
    monkeypatch.setattr(TRANSPORT, "fn",
                        lambda plan: FakeExecutor([n.login for n in plan.nodes], down))
    monkeypatch.setattr(spares, "unfit_hosts", lambda plan, executor: {})
    job = validate(spec(spare_hosts=["c", "d"]))
    plan = plan_of(job, run_id="r")
    said, ev = Said(), Events()
    rebuild = lambda j: plan_of(j, run_id="r")  # noqa: E731
    new, new_plan, ex = spares.reconnect(job, plan, lost_result(1), said, ev, rebuild, TRANSPORT)
    assert new.cluster.hosts == ["a", "d"] and [n.host for n in new_plan.nodes] == ["a", "d"]
    assert [(kw["rank"], kw["old_host"], kw["new_host"], kw["reason"]) for _, kw in ev.seen] == [
        (1, "b", "c", "connection lost"), (1, "c", "d", "unreachable: connection timed out")]
    down.add("d")
    with pytest.raises(UserError) as err:
        spares.reconnect(job, plan, lost_result(1), Said(), Events(), rebuild, TRANSPORT)
    assert err.value.lines() == ["cannot reach every host and no spare host is left; nothing was "
                                 "started anywhere:", "host d: connection timed out"]


def test_every_host_failing_alike_uses_no_spare(monkeypatch):
    """When the whole next attempt fails its host check (or cannot be reached), the cause is
    shared, not a host's: no spare is spent, one line per node, and nothing starts."""
    job = validate(spec(spare_hosts=["c", "d"]))
    plan = plan_of(job, run_id="r")
    rebuild = lambda j: plan_of(j, run_id="r")  # noqa: E731
    execs = []
    monkeypatch.setattr(TRANSPORT, "fn", lambda p: execs.append(
        FakeExecutor([n.login for n in p.nodes], set())) or execs[-1])
    monkeypatch.setattr(spares, "unfit_hosts", lambda p, ex: {
        n.rank: "health check: storage: /out: 0.1 GB free, under preflight.min_free_gb 5" for n in p.nodes})
    ev = Events()
    with pytest.raises(UserError) as err:
        spares.reconnect(job, plan, lost_result(1), Said(), ev, rebuild, TRANSPORT)
    lines = err.value.lines()
    assert lines[0].startswith("every host of the next attempt fails its health check: the cause "
                               "is shared") and lines[0].endswith("nothing was started anywhere:")
    assert lines[1:] == [f"node{r} {h}: health check: storage: /out: 0.1 GB free, under "
                         "preflight.min_free_gb 5" for r, h in enumerate("ac")]
    # The lost node 1 took spare c; the check then failed everywhere: d was never used.
    assert [kw["new_host"] for _, kw in ev.seen] == ["c"] and all(e.closed for e in execs)

    monkeypatch.setattr(TRANSPORT, "fn",
                        lambda p: FakeExecutor([n.login for n in p.nodes], {"a", "b", "c", "d"}))
    ev = Events()
    with pytest.raises(UserError) as err:
        spares.reconnect(job, plan, JobResult(1, []), Said(), ev, rebuild, TRANSPORT)
    assert err.value.lines()[0].startswith("every host of the next attempt cannot be reached")
    assert ev.seen == []


def test_a_rank_exit_replaces_nothing(monkeypatch):
    monkeypatch.setattr(TRANSPORT, "fn",
                        lambda plan: FakeExecutor([n.login for n in plan.nodes], set()))
    monkeypatch.setattr(spares, "unfit_hosts", lambda plan, executor: {})
    job = validate(spec(spare_hosts=["c"]))
    plan = plan_of(job, run_id="r")
    exited = JobResult(3, [NodeOutcome(0, "a", Exit(143), terminated=True), NodeOutcome(1, "b", Exit(3))])
    ev = Events()
    new, _, _ = spares.reconnect(job, plan, exited, Said(), ev, lambda j: plan_of(j, run_id="r"), TRANSPORT)
    assert new.cluster.hosts == ["a", "b"] and ev.seen == []


def test_cli_dry_run_shows_the_spares_and_refuses_duplicates(tmp_path):
    from .helpers import mlaunch, write_spec
    good = write_spec(tmp_path, spec(spare_hosts=["c"]) | {"max_restarts": 1}, "good.yaml")
    d = mlaunch("submit", good, "--dry-run")
    assert d.returncode == 0, d.stderr
    assert "spare hosts, in order: c: before a restart" in d.stdout
    j = mlaunch("submit", good, "--dry-run", "--json", "--run-id", "R1")
    assert json.loads(j.stdout)["restarts"] == {"max_restarts": 1, "backoff_s": 5.0, "spare_hosts": ["c"]}
    bad = write_spec(tmp_path, spec(spare_hosts=["a"], min_nodes=3), "bad.yaml")
    r = mlaunch("submit", bad, "--dry-run")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[1:] == [
        "mlaunch: cluster.min_nodes: 3 is more than the 2 nodes of cluster.hosts; give at most 2, or leave it out",
        "mlaunch: cluster.spare_hosts[0]: 'a' is already cluster.hosts[0]; a spare must be a machine the "
        "job does not use; remove it or name another"], r.stderr

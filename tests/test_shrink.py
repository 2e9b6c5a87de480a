"""Elastic shrink (issue 29): the batch arithmetic, the refusals, the dry-run's policy lines,
the drop of a lost node with no spare left, and a 3-node job finishing on 2 namespace hosts."""
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
from launcher.runs import shrink, spares
from launcher.plan import shrink as arith
from launcher.spec import validate
from launcher.view.present import describe_plan

from .helpers import plan_of, TRANSPORT, CONFIGS, limit, load_yaml, script_job
from .test_spares import Events, FakeExecutor, Said


def lora(hosts=3, gpus=2, per_device=2, grad_accum=3, **cluster) -> dict:
    """The Slurm LoRA example over ssh hosts, without DeepSpeed (DDP)."""
    data = copy.deepcopy(load_yaml(os.path.join(CONFIGS, "slurm", "qwen2-7b-lora.yaml")))
    c = data["cluster"]
    for k in ("scheduler", "slurm", "shared_dir"):
        c.pop(k, None)
    c.update(hosts=[f"n{i}" for i in range(hosts)], gpus_per_node=gpus, **cluster)
    del data["deepspeed"]
    data["batch"] = {"per_device": per_device, "grad_accum": grad_accum,
                     "global": hosts * gpus * per_device * grad_accum}
    return data


def problems(data: dict) -> list[str]:
    with pytest.raises(SpecError) as err:
        validate(data)
    return [str(p) for p in err.value.problems]


def test_regrad_keeps_the_global_batch_or_refuses():
    assert arith.regrad(24, 4, 2) == 3 and arith.regrad(24, 6, 2) == 2
    assert arith.regrad(24, 5, 2) is None and arith.regrad(24, 0, 2) is None
    assert arith.sizes(2, 3, 1, 24, 2) == [arith.Size(3, 6, 2), arith.Size(2, 4, 3),
                                           arith.Size(1, 2, 6)]
    assert [s.grad_accum for s in arith.sizes(1, 4, 2, 12, 1)] == [3, 4, 6]
    assert [s.grad_accum for s in arith.sizes(2, 3, 2, 18, 1)] == [3, None]


def test_refusal_line_names_the_node_counts_that_divide():
    table = arith.sizes(1, 4, 2, 8, 1)   # worlds 4, 3, 2: 8 splits over 4 and 2 nodes only
    size = next(s for s in table if s.grad_accum is None)
    assert arith.refusal(size, 8, 1, table) == (
        "cannot shrink to 3 nodes: the global batch 8 is not a multiple of world 3 × per_device "
        "1 = 3 (per_device is never raised); node counts that keep it: 4, 2; give a batch.global "
        "that they divide, or a cluster.min_nodes that avoids it; the run ends")
    assert arith.refusal(size, 8, 1, [size]).split("; ")[1] == (
        "no node count from cluster.min_nodes up keeps it")


@pytest.mark.parametrize("change, line", [
    ({"min_nodes": 4}, "cluster.min_nodes: 4 is more than the 3 nodes of cluster.hosts; give at "
                       "most 3, or leave it out"),
    ({"min_nodes": 2, "gpus_per_node": [2, 2, 1]},
     "cluster.gpus_per_node: [2, 2, 1]: a shrink (cluster.min_nodes 2) may drop any node, so every "
     "node must run the same count; give one count, or set min_nodes to the node count"),
])
def test_min_nodes_refusals(change, line):
    data = lora()
    data["cluster"].update(change)
    if isinstance(change.get("gpus_per_node"), list):
        data["batch"] = {"per_device": 1, "grad_accum": 1}
    assert problems(data) == [line]


def test_zero_and_megatron_shrink_refused_ddp_lora_accepted(tmp_path):
    validate(lora(min_nodes=2))
    validate(lora(min_nodes=2) | {"deepspeed": {"stage": 2}})   # the universal-checkpoint route
    validate(lora(min_nodes=2) | {"deepspeed": {"stage": 1}})
    validate(lora(min_nodes=2) | {"deepspeed": {"stage": 3}})
    # CPU offload keeps the checkpoint's layout (tests/test_spares_training.py resumes both)
    validate(lora(min_nodes=2) | {"deepspeed": {"stage": 2, "offload_optimizer": "cpu"}})
    validate(lora(min_nodes=2) | {"deepspeed": {"stage": 3, "offload_param": "cpu",
                                                "offload_optimizer": "cpu"}})
    head = ("cluster.min_nodes: 2: a DeepSpeed checkpoint holds one optimizer shard per rank; "
            "mlaunch resumes it at another data-parallel size through DeepSpeed's universal "
            "checkpoint (ds_to_universal, then checkpoint.load_universal), verified for "
            "LLaMA-Factory and ms-swift with ZeRO-2 and ZeRO-3 (ZeRO-1 shares ZeRO-2's optimizer), "
            "CPU offload with LLaMA-Factory, from the spec's "
            "stage or your own ds_config, over ssh and under Slurm, not ")
    tail = ("; set cluster.min_nodes to the node count (3), give cluster.spare_hosts instead, or "
            "use deepspeed.stage 1, 2 or 3 with offload to cpu or none")
    nvme = {"deepspeed": {"stage": 2, "offload_optimizer": "nvme", "nvme_path": str(tmp_path)}}
    assert problems(lora(min_nodes=2) | nvme) == [head + "with offload_optimizer to nvme" + tail]
    nvme3 = {"deepspeed": {"stage": 3, "offload_param": "nvme", "nvme_path": str(tmp_path)}}
    assert problems(lora(min_nodes=2) | nvme3) == [head + "with offload_param to nvme" + tail]
    data = copy.deepcopy(load_yaml(os.path.join(CONFIGS, "seed003-qwen2.5-14b-swift-megatron.yaml")))
    n = len(data["cluster"]["hosts"])
    data["cluster"]["min_nodes"] = n - 1
    got = problems(data)
    assert (f"cluster.min_nodes: {n - 1}: Megatron-SWIFT's distributed checkpoint is laid out for "
            "its tp/pp/dp grid and mlaunch does not re-shard it; set cluster.min_nodes to the node "
            f"count ({n}) or give cluster.spare_hosts instead") in got, got


def test_shrink_reads_the_users_own_ds_config(tmp_path):
    """deepspeed.config: the stage and offload come from the file; its own checkpoint keys stay
    beside load_universal in the shrunk attempt's ds_config."""
    from launcher.plan.trainers import ds_file
    path = tmp_path / "ds.json"
    own = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
           "gradient_accumulation_steps": "auto", "checkpoint": {"tag_validation": "Warn"},
           "zero_optimization": {"stage": 3}}
    path.write_text(json.dumps(own))
    job = validate(lora(min_nodes=2) | {"deepspeed": {"config": str(path)}})
    written = json.loads(ds_file(job, "ds.json", universal=True).content)
    assert written["checkpoint"] == {"tag_validation": "Warn", "load_universal": True}
    assert written["zero_optimization"]["stage"] == 3
    own["zero_optimization"] |= {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    path.write_text(json.dumps(own))
    validate(lora(min_nodes=2) | {"deepspeed": {"config": str(path)}})
    own["zero_optimization"] |= {"offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"},
                                 "offload_param": {"device": "nvme", "nvme_path": "/nvme"}}
    path.write_text(json.dumps(own))
    (line,) = problems(lora(min_nodes=2) | {"deepspeed": {"config": str(path)}})
    assert line.startswith("cluster.min_nodes: 2: a DeepSpeed checkpoint holds"), line
    assert f"not with offload_optimizer and offload_param to nvme in {path};" in line, line
    own["zero_optimization"] = {"stage": 0}
    path.write_text(json.dumps(own))
    (line,) = problems(lora(min_nodes=2) | {"deepspeed": {"config": str(path)}})
    assert f"not ZeRO stage 0 in {path};" in line, line


def test_dry_run_shows_the_smallest_world_and_the_batch_at_each_size():
    job = validate(lora(per_device=1, grad_accum=2, min_nodes=1) | {"max_restarts": 2})
    text = describe_plan(plan_of(job, run_id="r"))   # global 12 over worlds 6, 4, 2
    got = [ln for ln in text.splitlines() if ln.startswith(("elastic shrink", "  at "))]
    assert got == [
        "elastic shrink: down to 1 nodes (cluster.min_nodes), world 2: a node lost with no spare "
        "left is dropped and the restart runs on the healthy hosts (node 0 kept when healthy)",
        "  at 3 nodes: global batch 12 = world 6 × 1 per device × 2 accumulation",
        "  at 2 nodes: global batch 12 = world 4 × 1 per device × 3 accumulation",
        "  at 1 nodes: global batch 12 = world 2 × 1 per device × 6 accumulation"], text
    job = validate(lora(hosts=4, gpus=1, per_device=1, grad_accum=3, min_nodes=3))
    text = describe_plan(plan_of(job, run_id="r"))
    assert ("  at 3 nodes: refused: global batch 12 is not a multiple of world 3 × 1 per device "
            "(per_device is never raised)") not in text   # 12 = 3 × 4: it divides
    job = validate(lora(hosts=3, gpus=1, per_device=2, grad_accum=3, min_nodes=2))
    text = describe_plan(plan_of(job, run_id="r"))   # global 18: world 2 × 2 misses it
    assert ("  at 2 nodes: refused: global batch 18 is not a multiple of world 2 × 2 per device "
            "(per_device is never raised)") in text, text


def test_drop_keeps_node0_and_the_global_batch():
    job = validate(lora(per_device=1, grad_accum=2, min_nodes=2))   # 3 × 2 × 1 × 2 = 12
    said, ev = Said(), Events()
    new = shrink.drop(job, {1: "connection lost"}, said, ev)
    assert new.cluster.hosts == ["n0", "n2"] and new.batch.grad_accum == 3
    assert ev.seen == [("shrink", {"old_world": 6, "new_world": 4, "nodes": 2, "old_grad_accum": 2,
                                   "new_grad_accum": 3, "global_batch": 12,
                                   "lost": "node1 n1 (connection lost)"})]
    assert said.lines == ["shrink: lost node1 n1 (connection lost); the next attempt runs on 2 "
                          "nodes, world 6 -> 4 processes, grad_accum 2 -> 3, global batch 12 = 4 × "
                          "1 per device × 3 (kept)"]
    plan = plan_of(new, run_id="r")
    assert [n.host for n in plan.nodes] == ["n0", "n2"]
    yaml = next(f.content for f in plan.files if f.path.endswith(".yaml"))
    assert re.search(r"^gradient_accumulation_steps: 3$", yaml, re.M), yaml


def test_a_shrink_keeps_each_nodes_own_gpus():
    """cuda_visible_devices given per node: the lost node's list goes with it, so n2 still runs
    on GPUs 4,5 (it ran on n1's 2,3 after a shrink)."""
    job = validate(lora(per_device=1, grad_accum=2, min_nodes=2, cuda_visible_devices=[[0, 1], [2, 3], [4, 5]]))
    new = shrink.drop(job, {1: "connection lost"}, Said(), Events())
    assert new.cluster.cuda_visible_devices == [[0, 1], [4, 5]]
    plan = plan_of(new, run_id="r")
    assert [(n.host, dict(n.env).get("CUDA_VISIBLE_DEVICES")) for n in plan.nodes] == [("n0", "0,1"), ("n2", "4,5")]


def test_drop_refusals():
    job = validate(lora(gpus=1, per_device=2, grad_accum=3, min_nodes=2))   # global 18
    with pytest.raises(UserError) as err:
        shrink.drop(job, {0: "connection lost"}, Said(), Events())
    assert err.value.lines() == [
        "lost node0 n0 (connection lost): cannot shrink to 2 nodes: the global batch 18 is not a "
        "multiple of world 2 × per_device 2 = 4 (per_device is never raised); node counts that keep "
        "it: 3; give a batch.global that they divide, or a "
        "cluster.min_nodes that avoids it; the run ends"]
    job = validate(lora(min_nodes=2))
    with pytest.raises(UserError) as err:
        shrink.drop(job, {1: "connection lost", 2: "connection lost"}, Said(), Events())
    assert err.value.lines() == [
        "cluster.min_nodes: 2: lost node1 n1 (connection lost); node2 n2 (connection lost), which "
        "leaves 1 node(s) and no spare host; the run ends"]


def lost3(rank: int) -> JobResult:
    nodes = [NodeOutcome(r, f"n{r}", Exit(255, lost=True, detail="connection lost") if r == rank
                         else Exit(143), terminated=r != rank) for r in range(3)]
    return JobResult(255, nodes, first_failure=rank)


def test_reconnect_shrinks_with_no_spare_and_refuses_below_min_nodes(monkeypatch):
    down = set()
    monkeypatch.setattr(TRANSPORT, "fn",
                        lambda plan: FakeExecutor([n.login for n in plan.nodes], down))
    monkeypatch.setattr(spares, "unfit_hosts", lambda plan, executor: {})
    job = validate(lora(per_device=1, grad_accum=2, min_nodes=2))
    plan = plan_of(job, run_id="r")
    rebuild = lambda j: plan_of(j, run_id="r")  # noqa: E731
    ev = Events()
    new, new_plan, _ = spares.reconnect(job, plan, lost3(0), Said(), ev, rebuild, TRANSPORT)
    assert [n.host for n in new_plan.nodes] == ["n1", "n2"] and new.batch.grad_accum == 3
    argv = new_plan.nodes[1].argv
    assert argv[argv.index("--master-addr") + 1] == "n1"   # the new node 0 is the master
    assert [e for e, _ in ev.seen] == ["shrink"]
    down.add("n2")   # node1 dropped, then node2 unreachable: at min_nodes 2 already, so refused
    with pytest.raises(UserError) as err:   # issue 50: the min_nodes line, naming both
        spares.reconnect(job, plan, lost3(1), Said(), Events(), rebuild, TRANSPORT)
    assert err.value.lines() == [
        "cluster.min_nodes: 2: lost node1 n1 (connection lost); node2 n2 (unreachable: connection "
        "timed out), which leaves 1 node(s) and no spare host; the run ends"]


def test_lost_node_dropped_when_no_spare_is_left(make_hostset, tmp_path):
    """3 nodes, no spare, min_nodes 2, max_restarts 1: node 1's rank fails with a GPU ECC error
    (a hardware-looking cause, watch/hwcause.py); the restart runs on nodes 0 and 2 as ranks
    0 and 1 of a world of 2, and exits 0."""
    from .test_fanout import node_logs, start
    with make_hostset(3) as hs:
        a, b, c = hs.hosts
        out = str(tmp_path / "out")
        os.makedirs(out)
        job = script_job([a.ip, b.ip, c.ip], 1, "spare_job.py", [out, "1"], out, hs=hs,
                         min_nodes=2) | {"max_restarts": 1, "restart_backoff_s": 0}
        proc = start(tmp_path, job)
        rest = proc.communicate(timeout=limit(240))[0]
        assert proc.returncode == 0, rest[-4000:]
        cause = "GPU ECC error: [default0]:RuntimeError: CUDA error: uncorrectable ECC error encountered"
        assert (f"shrink: lost node1 {b.ip} ({cause}); the next attempt runs on 2 nodes, "
                "world 3 -> 2 processes") in rest, rest[-4000:]
        for rank, h in ((0, a), (1, c)):
            assert re.search(rf"^\[node{rank} {re.escape(h.ip)} local0\] where rank {rank}/2 node "
                             rf"{rank} host {h.name} attempt 1$", rest, re.M), rest[-4000:]
        assert sorted(os.listdir(out)) == ["done-rank0-attempt1", "done-rank1-attempt1", "logs"]
        assert open(os.path.join(out, "done-rank1-attempt1")).read() == c.name
        safe = c.ip.replace(":", "_")
        assert f"where rank 1/2 node 1 host {c.name} attempt 1" in node_logs(out)[f"node1-{safe}.attempt1.log"]
        (path,) = glob.glob(f"{out}/logs/*/events.jsonl")
        events = [json.loads(ln) for ln in open(path)]
        (hw,) = [e for e in events if e["event"] == "hardware_error"]
        assert (hw["attempt"], hw["node"], hw["host"], hw["cause"]) == (0, 1, b.ip, cause)
        (ev,) = [e for e in events if e["event"] == "shrink"]
        assert (ev["attempt"], ev["old_world"], ev["new_world"], ev["nodes"]) == (1, 3, 2, 2)
        assert events[-1]["event"] == "run_end" and events[-1]["code"] == 0


def test_cli_dry_run_shows_the_shrink_and_refuses_nvme_offload(tmp_path):
    from .helpers import mlaunch, write_spec
    good = write_spec(tmp_path, lora(per_device=1, grad_accum=2, min_nodes=2), "good.yaml")
    d = mlaunch("submit", good, "--dry-run")
    assert d.returncode == 0, d.stderr
    assert "  at 2 nodes: global batch 12 = world 4 × 1 per device × 3 accumulation" in d.stdout
    j = mlaunch("submit", good, "--dry-run", "--json", "--run-id", "R1")
    assert json.loads(j.stdout)["restarts"]["min_nodes"] == 2
    bad = write_spec(tmp_path, lora(min_nodes=2) | {"deepspeed": {"stage": 3, "offload_param": "nvme",
                                                                  "nvme_path": str(tmp_path)}}, "bad.yaml")
    r = mlaunch("submit", bad, "--dry-run")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[1].startswith(
        "mlaunch: cluster.min_nodes: 2: a DeepSpeed checkpoint holds one optimizer shard"), r.stderr
    assert "not with offload_param to nvme;" in r.stderr, r.stderr

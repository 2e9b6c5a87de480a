"""Issues 29 and 50 with a real trainer on CPU over namespace hosts: LLaMA-Factory LoRA resumed on
a spare (3 nodes + 1 spare), and full fine-tunes with ZeRO-2 + CPU offload and ZeRO-3 (the
user's own ds_config file) shrunk from 4 to 3 nodes through the universal checkpoint after a
node froze. Each is held to an uninterrupted run: the spare's at the same world for the 15 steps
after the cut, the shrunk ones at the new world for 20 steps and to Adam's step in the
checkpoints after it."""
from __future__ import annotations

import glob
import json
import os
import re

import pytest

from .helpers import limit
from .training import (adam_moments, adam_steps, build_tiny, by_attempt, cut_then_release, held_at, lf_spec,
                       logged, losses, require_trainer, same_optimizer_state, submit_and_cut, trainer_state,
                       uninterrupted)

pytestmark = [pytest.mark.multihost, pytest.mark.training]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    require_trainer()
    return build_tiny(str(tmp_path_factory.mktemp("tiny")))


STEPS = 20


def test_lora_lost_node_resumes_on_the_spare(make_hostset, tmp_path, tiny):
    """3 nodes + 1 spare (the issue's form): every trainer holds right after saving
    checkpoint-5 (tests/hold/), node 1's link is cut, the others go on and block on node 1 in
    their next collective; mlaunch loses node 1, the restart runs on the spare with the same
    world, resumes from checkpoint-5 and reaches max_steps. Then the same spec runs
    uninterrupted at the same world (localhost, 3 processes): each of the 15 steps the spare
    trained has that run's loss, to rel 1e-5 (the bound test_training.py's kill-and-resume run
    holds), as has each of attempt 0's. Adam's moments are in that curve: a restart that loaded
    the weights but not the optimizer state steps differently from its first step on."""
    out, where = str(tmp_path / "out"), str(tmp_path / "hold")
    with make_hostset(4) as hs:
        a, b, c, spare = hs.hosts
        spec = lf_spec(tiny, [a.ip, b.ip, c.ip], 1, out, hs=hs, max_steps=STEPS, save_steps=5,
                       max_restarts=1, restart_backoff_s=0)
        spec["cluster"] |= {"spare_hosts": [spare.ip], "hangup_after_s": 6}
        held_at(spec, 5, where)
        held = lambda: len(glob.glob(f"{where}/held-5-rank*")) == 3  # noqa: E731
        code, rest = submit_and_cut(tmp_path, spec, held, lambda _: cut_then_release(b, where))
    assert code == 0, rest[-4000:]
    assert re.search(rf"host replaced: node1 {re.escape(b.ip)} -> spare {re.escape(spare.ip)} "
                     r"\(connection lost: not responding [^\n]*\); the world stays 3 processes", rest), rest[-4000:]
    assert f"restart 1/1: resuming from {out}/checkpoint-5\n" in rest, rest[-4000:]
    state = trainer_state(out)
    assert state["global_step"] == STEPS and sorted(losses(state)) == list(range(1, STEPS + 1))
    rows = logged(out)   # (step, loss) in write order: attempt 0 up to the cut, then attempt 1
    first, second = by_attempt(rows, 5)
    assert sorted(first) == list(range(1, 6)) and sorted(second) == list(range(6, STEPS + 1)), rows
    for step, loss in losses(state).items():   # the final curve: attempt 0's to the checkpoint, then the spare's
        assert loss == pytest.approx(first[step] if step <= 5 else second[step], rel=1e-5), step
    reference = uninterrupted(tmp_path, lf_spec(tiny, ["localhost"], 3, str(tmp_path / "reference"),
                                                max_steps=STEPS, save_steps=5))
    print(f"[losses] attempt 0: {first}; attempt 1 on the spare: {second}; uninterrupted: {reference}")
    for step, loss in {**first, **second}.items():
        assert loss == pytest.approx(reference[step], rel=1e-5), (step, first, second, reference)


CUT_AT, AFTER = 5, 20   # the checkpoint the freeze follows; steps compared after the cut


def _shrink_and_reference(make_hostset, tmp_path, tiny, deepspeed: dict) -> tuple[str, list[str], str, dict]:
    """A full fine-tune on 4 namespace hosts, min_nodes 2, global batch 12 (1 per device × 3),
    saving every 5 steps to CUT_AT + AFTER steps. Every trainer holds right after saving
    checkpoint-5 (tests/hold/); node 3 is frozen (every process of it stopped, as a hung
    machine), then the others go on, block on node 3 in their next collective, and mlaunch
    loses node 3 and shrinks to 3 nodes from checkpoint-5 (grad_accum 4). Then the same job
    uninterrupted at world 3 (localhost, 3 processes, grad_accum 4): the reference.
    Returns the console, the hosts' IPs, the output_dir and the reference's losses."""
    out, where = str(tmp_path / "out"), str(tmp_path / "hold")
    sched = {"finetuning": {"type": "full"}, "deepspeed": deepspeed, "max_steps": CUT_AT + AFTER,
             "save_steps": CUT_AT}
    with make_hostset(4) as hs:
        spec = lf_spec(tiny, [h.ip for h in hs.hosts], 1, out, hs=hs, max_restarts=1,
                       restart_backoff_s=0, **sched) | {"batch": {"per_device": 1, "grad_accum": 3}}
        spec["cluster"] |= {"min_nodes": 2, "hangup_after_s": 6}
        held_at(spec, CUT_AT, where)
        held = lambda: len(glob.glob(f"{where}/held-{CUT_AT}-rank*")) == 4  # noqa: E731
        try:
            code, rest = submit_and_cut(tmp_path, spec, held, lambda _: _freeze_then_release(hs.hosts[3], where))
        finally:
            hs.hosts[3].thaw()
    assert code == 0, rest[-4000:]
    ref = lf_spec(tiny, ["localhost"], 3, str(tmp_path / "reference"), **sched) | {
        "batch": {"per_device": 1, "grad_accum": 4}}
    return rest, [h.ip for h in hs.hosts], out, uninterrupted(tmp_path, ref, timeout=limit(900))


def _freeze_then_release(host, where: str) -> None:
    host.freeze()
    open(os.path.join(where, "release"), "w").close()


def _trains_the_same_model(rest: str, out: str, reference: dict[int, float], what: str) -> None:
    """The shrunk run resumed checkpoint-5 at world 3 and reached max_steps; the first
    checkpoint after the shrink (checkpoint-10) and the last hold Adam's step equal to their
    global step on every rank (DeepSpeed's ZeRO-3 universal loader shared one step tensor
    between the parameter groups: 10 -> 15 by checkpoint-10 without mlaunch's fix); every one of
    the AFTER steps after the cut has its loss within 0.5 % of the uninterrupted world-3 run
    (both curves printed; measured: equal to the 4 decimals logged. The issue asks 3 %: with
    the fix disabled this tiny run is -0.9 % at step 20 and -1.9 % at step 25, inside 3 %, so
    the tighter bound and the steps are what see a different model here); and the last
    checkpoint's optimizer shards hold the uninterrupted run's moments (same_optimizer_state:
    the same shards, sizes and Adam step, the norms of exp_avg and exp_avg_sq within 2 %)."""
    last = CUT_AT + AFTER
    assert f"restart 1/1: resuming from {out}/checkpoint-{CUT_AT}\n" in rest, rest[-4000:]
    assert "Total train batch size (w. parallel, distributed & accumulation) = 12" in rest
    steps = adam_steps(f"{out}/checkpoint-{2 * CUT_AT}")
    assert len(steps) == 3 and all(v == [2 * CUT_AT] for v in steps.values()), steps
    ref_out = os.path.join(os.path.dirname(out), "reference")   # _shrink_and_reference's
    bad = same_optimizer_state(adam_moments(f"{out}/checkpoint-{last}"),
                               adam_moments(f"{ref_out}/checkpoint-{last}"), last)
    assert not bad, bad
    state = trainer_state(out)
    got = losses(state)
    assert state["global_step"] == last and sorted(got) == list(range(1, last + 1)), got
    after = range(CUT_AT + 1, last + 1)
    rel = {s: got[s] / reference[s] - 1 for s in after}
    print(f"[losses] {what}: step, shrunk, uninterrupted world 3, relative difference: "
          + "; ".join(f"{s} {got[s]:.4f} {reference[s]:.4f} {rel[s]:+.2%}" for s in after))
    assert all(abs(r) < 0.005 for r in rel.values()), rel
    assert got[last] < got[CUT_AT + 1], got


def test_zero2_offload_full_frozen_node_shrinks_4_to_3_and_trains_the_same_model(
        make_hostset, tmp_path, tiny):
    """4 nodes, no spare, min_nodes 2, full fine-tuning with ZeRO-2 and the optimizer offloaded
    to the CPU (DeepSpeed's CPUAdam steps the fp32 partitions; plain ZeRO-2 is the Slurm
    test's): node 3 is frozen after checkpoint-5; the restart converts it to DeepSpeed's
    universal checkpoint on node 0 and runs on 3 nodes with grad_accum 4 (global batch 12
    kept) to step 25, training the model an uninterrupted world-3 run trains
    (_trains_the_same_model)."""
    rest, ips, out, reference = _shrink_and_reference(
        make_hostset, tmp_path, tiny, {"stage": 2, "offload_optimizer": "cpu"})
    # DeepSpeedCPUAdam's own line: ZeRO-Offload swapped the Trainer's AdamW for it on every
    # rank of both attempts (4 + 3)
    assert rest.count("Adam Optimizer #0 is created with") == 7, rest[-4000:]
    assert re.search(rf"shrink: lost node3 {re.escape(ips[3])} \(connection lost: not responding "
                     r"[^\n]*\); the next attempt runs on 3 nodes, world 4 -> 3 processes, "
                     r"grad_accum 3 -> 4, global batch 12 = 3 × 1 per device × 4 \(kept\)", rest), rest[-4000:]
    ckpt = f"{out}/checkpoint-{CUT_AT}"
    assert (f"resume: {ckpt} was saved at world 4; converted to DeepSpeed's universal checkpoint "
            f"on node0 {ips[0]} (ds_to_universal), loaded at world 3 "
            "(checkpoint.load_universal)") in rest, rest[-4000:]
    assert open(f"{ckpt}/latest_universal").read() == f"global_step{CUT_AT}_universal"
    assert os.path.exists(f"{ckpt}/global_step{CUT_AT}_universal/.mlaunch-complete")
    _trains_the_same_model(rest, out, reference, "ZeRO-2 + CPU offload, world 4 -> 3")
    events = [json.loads(ln) for p in glob.glob(f"{out}/logs/*/events.jsonl") for ln in open(p)]
    (conv,) = [e for e in events if e["event"] == "universal_checkpoint"]
    assert (conv["saved_world"], conv["world"], conv["converted"]) == (4, 3, True)


def test_zero3_own_ds_config_frozen_node_shrinks_4_to_3_and_trains_the_same_model(
        make_hostset, tmp_path, tiny):
    """ZeRO-3 (parameters sharded too) from the user's own ds_config file with "auto" batch
    keys and a checkpoint section of its own, the Trainer's AdamW (no offload: the case whose
    universal load shared one step between the parameter groups): 4 nodes, min_nodes 2;
    node 3 is frozen after checkpoint-5; node 0 converts the ZeRO-3 checkpoint to the
    universal one, the restart runs on 3 nodes with grad_accum 4 from a ds_config that keeps
    the user's keys and adds load_universal, the entry gives each parameter group its own
    step after the load (its line), and the run trains the model an uninterrupted world-3 run
    trains (_trains_the_same_model)."""
    own = tmp_path / "my_ds.json"
    own.write_text(json.dumps({
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
        "checkpoint": {"tag_validation": "Warn"},
        "zero_optimization": {"stage": 3, "overlap_comm": False,
                              "stage3_gather_16bit_weights_on_model_save": True}}))
    rest, ips, out, reference = _shrink_and_reference(make_hostset, tmp_path, tiny, {"config": str(own)})
    assert re.search(rf"shrink: lost node3 {re.escape(ips[3])} \(connection lost: not responding "
                     r"[^\n]*\); the next attempt runs on 3 nodes, world 4 -> 3 processes, "
                     r"grad_accum 3 -> 4, global batch 12 = 3 × 1 per device × 4 \(kept\)", rest), rest[-4000:]
    ckpt = f"{out}/checkpoint-{CUT_AT}"
    assert (f"resume: {ckpt} was saved at world 4; converted to DeepSpeed's universal checkpoint "
            f"on node0 {ips[0]} (ds_to_universal), loaded at world 3") in rest, rest[-4000:]
    assert os.path.exists(f"{ckpt}/global_step{CUT_AT}_universal/.mlaunch-complete")
    assert re.search(rf"mlaunch: universal load of {re.escape(ckpt)}/global_step{CUT_AT}_universal "
                     rf"\(global step {CUT_AT}\): DeepSpeedZeroOptimizer_Stage3 optimizer step "
                     rf"\[{CUT_AT}\] in \d+ states; [1-9]\d* shared one step tensor and got their own", rest), rest[-4000:]
    run_id = re.search(r"^\[mlaunch\] run (\S+): ", rest, re.M).group(1)
    (path,) = glob.glob(f"/tmp/mlaunch-*/.mlaunch/{run_id}/ds_config.json")  # default_base
    written = json.load(open(path))   # the last attempt's: the shrunk one
    assert written["checkpoint"] == {"tag_validation": "Warn", "load_universal": True}, written
    assert written["zero_optimization"]["stage"] == 3
    _trains_the_same_model(rest, out, reference, "ZeRO-3 (own ds_config), world 4 -> 3")

"""Issue 29: which nodes a restart does not reuse. The hardware-looking causes in a node's
output (watch/hwcause.py), the host check of the next attempt's hosts (preflight/hostcheck.py)
and what spares.reconnect and the Slurm exclusion do with them. Namespace-host runs:
test_spares.py (a spare whose GPU driver failed) and test_shrink.py (an ECC error)."""
from __future__ import annotations

import os

import pytest

from .helpers import plan_of, TRANSPORT

from launcher.errors import UserError
from launcher.watch import hwcause
from launcher.transport.base import LOST, Exit
from launcher.session.outcome import JobResult, NodeOutcome
from launcher.backends.slurm import exclude as slurm_exclude
from launcher.runs import spares
from launcher.preflight import hostcheck
from launcher.spec import validate

from .test_spares import Events, FakeExecutor, Said, spec


@pytest.mark.parametrize("line, what, device", [
    ("[default0]:RuntimeError: CUDA error: uncorrectable ECC error encountered", "GPU ECC error", True),
    ("NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, GPU has fallen off the bus.", "GPU lost", True),
    ("RuntimeError: No CUDA GPUs are available; no CUDA-capable device is detected", "no usable GPU", True),
    ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda "
     "error (run with NCCL_DEBUG=INFO for details)", "NCCL: unhandled cuda error", True),
    ("ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device "
     "error. NCCL error in: ..., unhandled system error", "NCCL: unhandled system error", False),
    ("n1:123:456 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2 with error 12", "InfiniBand error", False),
])
def test_hardware_looking_lines(line, what, device):
    got = hwcause.cause(line)
    assert got is not None and got[0].startswith(f"{what}: ") and got[1] is device, got
    assert hwcause.first_cause(["{'loss': 1.0}", line]) == got   # the cheap word scan lets it by


def test_an_ib_work_completion_status_is_a_link_cause():
    got = hwcause.first_cause(["NCCL WARN NET/IB : wc status IBV_WC_RETRY_EXC_ERR opcode 0"])
    assert got is not None and got[0].startswith("InfiniBand error: ") and got[1] is False


@pytest.mark.parametrize("line", [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "RuntimeError: CUDA error: device-side assert triggered",
    "ValueError: loss is nan", "{'loss': 1.25, 'grad_norm': 0.5, 'epoch': 0.1}",
    "    ECC Errors", "        Volatile ECC errors: 0",   # nvidia-smi -q on a healthy GPU
    "NVRM: Xid (PCI:0000:3b:00): 31, pid=1234, Ch 00000008, intr 00000000. MMU Fault",
    "xid = 7; commit transaction",
    "n0:11:22 [0] NCCL INFO NET/IB : dmabuf registration failed, falling back to peermem",
    "UserWarning: CUDA initialization: CUDA driver initialization failed, you might not have a "
    "CUDA gpu. (Triggered internally at c10/cuda/CUDAFunctions.cpp:108.)",   # a CPU-only host
])
def test_software_errors_are_not_hardware(line):
    assert hwcause.cause(line) is None and hwcause.first_cause([line]) is None


def test_a_link_cause_counts_only_for_the_node_that_failed_first():
    seen = {0: ("NCCL: unhandled system error: x", False), 1: ("NCCL: unhandled system error: y", False),
            2: ("GPU ECC error: z", True)}
    assert hwcause.hardware_nodes(seen, 1, {0}) == {1: "NCCL: unhandled system error: y",
                                                    2: "GPU ECC error: z"}
    assert hwcause.hardware_nodes(seen, 0, {0}) == {2: "GPU ECC error: z"}   # torn down: not its own


def test_a_lost_node_explains_its_peers_link_errors():
    """Node 1's link is cut: node 0 prints NCCL's "unhandled system error" and exits first,
    before node 1's loss is seen. Node 0 is healthy: only node 1 (lost) is to be replaced."""
    result = JobResult(1, [NodeOutcome(0, "a", Exit(1)),
                           NodeOutcome(1, "b", Exit(LOST, lost=True, detail="connection lost")),
                           NodeOutcome(2, "c", Exit(143), terminated=True)], first_failure=0,
                       hardware={0: ("NCCL: unhandled system error: x", False)})
    assert hwcause.of_result(result) == {}
    assert spares.lost_ranks(result) == {1: "connection lost"}
    alone = JobResult(1, result.nodes[:1] + [NodeOutcome(1, "b", Exit(143), terminated=True)],
                      first_failure=0, hardware=result.hardware)
    assert hwcause.of_result(alone) == {0: "NCCL: unhandled system error: x"}


def test_a_device_error_on_every_node_is_the_jobs_not_a_nodes():
    """A wrong CUDA_VISIBLE_DEVICES (or NCCL out of GPU memory) shows on every node: no node is
    to blame, so none is replaced; on one node of several it is that node's."""
    seen = {r: ("no usable GPU: no CUDA-capable device is detected", True) for r in range(3)}
    assert hwcause.hardware_nodes(seen, 0, {1, 2}, nodes=3) == {}
    del seen[0]
    assert hwcause.hardware_nodes(seen, 1, {2}, nodes=3) == {
        1: "no usable GPU: no CUDA-capable device is detected",
        2: "no usable GPU: no CUDA-capable device is detected"}


def _facts(free_gb=100.0, smi=True, code=0, workdir_error=None):
    f = {"out": {"path": "/o", "base": "/o", "writable": True, "free_gb": free_gb},
         "gpu": {"smi": "/usr/bin/nvidia-smi" if smi else None, "code": code,
                 "gpus": "0, GPU-1, 550.54.15, 0, 143771\n" if code == 0 else "NVIDIA-SMI has failed",
                 "apps": ""}}
    if workdir_error:
        f["workdir_error"] = workdir_error
    return f


def test_host_check_fails_disk_gpu_and_silent_probes_not_busy_gpus(monkeypatch):
    job = validate(spec(hosts=["a", "b", "c", "d", "e"]) | {"preflight": {"min_free_gb": 10}})
    plan = plan_of(job, run_id="r")
    busy = _facts()
    busy["gpu"]["apps"] = "GPU-1, 4242, python, 60000\n"   # the last attempt's memory, going away
    facts = {0: busy, 1: _facts(free_gb=2.5), 2: _facts(code=9), 3: "facts probe failed (exit 255)",
             4: _facts(smi=False)}
    monkeypatch.setattr(hostcheck, "gather_facts", lambda ctx: facts)
    monkeypatch.setattr(hostcheck, "cleanup", lambda ctx: None)
    assert hostcheck.unfit_hosts(plan, None) == {
        1: "health check: storage/output: 2.5 GB free under /o, need 10 GB",
        2: "health check: gpu: nvidia-smi failed: NVIDIA-SMI has failed",
        3: "health check: facts probe failed (exit 255)",
        4: "health check: gpu: no nvidia-smi here, while the other nodes have GPUs"}
    facts = {r: _facts(smi=False) for r in range(5)}   # CPU nodes: no GPU expected anywhere
    facts[0] = _facts(smi=False, workdir_error="/w: No such file or directory")
    assert hostcheck.unfit_hosts(plan, None) == {
        0: "health check: storage/output: workdir /w: No such file or directory"}


def test_an_unfit_host_takes_the_next_spare_or_ends_the_run(monkeypatch):
    monkeypatch.setattr(TRANSPORT, "fn",
                        lambda plan: FakeExecutor([n.login for n in plan.nodes], set()))
    unfit = {"c": "health check: gpu: nvidia-smi failed: x"}
    monkeypatch.setattr(spares, "unfit_hosts", lambda plan, executor: {
        n.rank: unfit[n.host] for n in plan.nodes if n.host in unfit})
    job = validate(spec(spare_hosts=["c", "d"]))
    plan = plan_of(job, run_id="r")
    rebuild = lambda j: plan_of(j, run_id="r")  # noqa: E731
    ecc = JobResult(1, [NodeOutcome(0, "a", Exit(143), terminated=True), NodeOutcome(1, "b", Exit(1))],
                    first_failure=1, hardware={1: ("GPU ECC error: e", True)})
    said, ev = Said(), Events()
    new, new_plan, _ = spares.reconnect(job, plan, ecc, said, ev, rebuild, TRANSPORT)
    assert [n.host for n in new_plan.nodes] == ["a", "d"] and new.cluster.spare_hosts == []
    assert [(kw["old_host"], kw["new_host"], kw["reason"]) for _, kw in ev.seen] == [
        ("b", "c", "GPU ECC error: e"), ("c", "d", "health check: gpu: nvidia-smi failed: x")]
    unfit["a"] = "health check: storage/output: 0.5 GB free under /o, need 10 GB"
    ev = Events()   # b -> c (ECC); then a and c fail the check: a -> d, and none is left for c
    with pytest.raises(UserError) as err:
        spares.reconnect(job, plan, ecc, Said(), ev, rebuild, TRANSPORT)
    assert err.value.lines() == [
        "a host of the next attempt fails its health check and no spare host is left; nothing "
        "was started anywhere:", "node1 c: health check: gpu: nvidia-smi failed: x"]
    assert [(kw["old_host"], kw["new_host"]) for _, kw in ev.seen] == [("b", "c"), ("a", "d")]


def test_slurm_restart_excludes_a_node_with_a_hardware_looking_cause(monkeypatch):
    monkeypatch.setattr(slurm_exclude, "failed_nodes", lambda names: {})
    result = JobResult(1, [NodeOutcome(0, "n0", Exit(143), terminated=True),
                           NodeOutcome(1, "n1", Exit(1))], first_failure=1,
                       hardware={1: ("NCCL: unhandled system error: s", False),
                                 0: ("NCCL: unhandled system error: t", False)})
    assert slurm_exclude.failed(result) == {"n1": "NCCL: unhandled system error: s"}


def test_a_hardware_cause_is_recorded_with_secrets_masked(tmp_path):
    """The cause goes to events.jsonl, the console and the registry: a secret a node printed
    on that line is masked there, as in the node logs."""
    import json
    import time
    from launcher.watch.watch import Watch
    job = validate(spec(env={"HF_TOKEN": "hf_abcdefgh12345"}))
    plan = plan_of(job, run_id="r", log_dir=str(tmp_path))
    watch = Watch(plan, None, print, time.monotonic)
    watch.hardware_in(1, "b", ["RuntimeError: CUDA error: uncorrectable ECC error encountered "
                         "(token hf_abcdefgh12345)"])
    why, own = watch.hardware[1]
    assert own and "hf_abcdefgh12345" not in why and why.startswith("GPU ECC error: "), why
    (path,) = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs
               if f == "events.jsonl"]
    (ev,) = [json.loads(ln) for ln in open(path)]
    assert ev["event"] == "hardware_error" and ev["cause"] == why


def test_a_device_cause_after_a_link_cause_is_the_nodes(tmp_path):
    """Node 1's ranks print NCCL's "unhandled system error" first, then its GPU's ECC error:
    the node keeps the DEVICE cause (it counts whichever node failed first); later lines change
    nothing."""
    import time
    from launcher.watch.watch import Watch
    plan = plan_of(validate(spec()), run_id="r", log_dir=str(tmp_path))
    watch = Watch(plan, None, print, time.monotonic)
    watch.hardware_in(1, "b", ["NCCL error in: x, unhandled system error (run with NCCL_DEBUG=INFO)"])
    assert watch.hardware[1][1] is False
    watch.hardware_in(1, "b", ["{'loss': 1.0}", "NET/IB : Got completion from peer with error 12"])
    assert watch.hardware[1][0].startswith("NCCL: unhandled system error: ")
    watch.hardware_in(1, "b", ["RuntimeError: CUDA error: uncorrectable ECC error encountered"])
    assert watch.hardware[1] == ("GPU ECC error: RuntimeError: CUDA error: uncorrectable ECC "
                                 "error encountered", True)
    watch.hardware_in(1, "b", ["RuntimeError: CUDA error: GPU is lost"])
    assert watch.hardware[1][0].startswith("GPU ECC error: ")


def test_hardware_cause_read_from_the_node_logs_after_a_failed_attempt(tmp_path, monkeypatch):
    """The streaming path does not scan for hardware words; a failed attempt's node logs are
    read back (their last HW_TAIL_BYTES, in 4 MiB reads) and give the same first cause, the
    DEVICE one outranking an earlier LINK one; a cause before the tail is not read."""
    import time
    from launcher.watch import watch as watch_mod
    from launcher.watch.watch import Watch
    plan = plan_of(validate(spec()), run_id="r", log_dir=str(tmp_path))
    watch = Watch(plan, None, print, time.monotonic)
    filler = "".join(f"{{'loss': 1.0, 'step': {i}}}\n" for i in range(300_000))   # ~8 MiB
    logs = {0: filler + "RuntimeError: CUDA error: uncorrectable ECC error encountered\n" + filler,
            1: "NCCL error in: x, unhandled system error\n" + filler + "é" * 3 + "\n"
               "RuntimeError: CUDA error: GPU is lost\n" + filler}
    for node in plan.nodes:
        os.makedirs(os.path.dirname(node.log_path), exist_ok=True)
        with open(node.log_path, "w") as fh:
            fh.write(logs[node.rank])
    ecc = "RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
    assert watch.text(0, "a", ecc) is None and watch.hardware == {}   # streaming: no scan
    watch.hardware_in_logs()
    assert watch.hardware == {
        0: ("GPU ECC error: RuntimeError: CUDA error: uncorrectable ECC error encountered", True),
        1: ("GPU lost: RuntimeError: CUDA error: GPU is lost", True)}
    monkeypatch.setattr(watch_mod, "HW_TAIL_BYTES", len(filler) - 1000)
    watch = Watch(plan, None, print, time.monotonic)
    watch.hardware_in_logs()
    assert watch.hardware == {}

"""The health check of a restart's hosts (issue 29): which nodes a spare should replace.

Before a restart that may use spares or shrink, every host of the next attempt gets the
fast checks that say whether the machine itself is fit, from one facts probe per node:
  * the probe answers at all (the host runs the job's Python);
  * gpu: nvidia-smi works and shows the GPUs the job uses, with the driver most nodes have;
    when any node of the attempt has nvidia-smi, a node without it fails too (GPUs are
    expected there). GPUs still holding memory are not judged here: the failed attempt's
    processes may be releasing theirs;
  * storage/output: cluster.workdir exists, output_dir (or its parent) is writable and has
    preflight.min_free_gb free.
Reachability is connect()'s own check (runs/spares.py). The rest of preflight (versions,
ports, mesh, clock, inputs) is the same code on every host, or about the job, not the host.
"""
from __future__ import annotations

from ..transport.base import Executor
from ..plan.launch_plan import LaunchPlan
from . import gpu, storage
from .probe import Ctx, cleanup, gather_facts
from .report import CheckResult


def unfit_hosts(plan: LaunchPlan, executor: Executor) -> dict[int, str]:
    """{rank: why} of the nodes of plan (all connected) that fail a host check."""
    ctx = Ctx(plan, executor, fast_only=True)
    facts = gather_facts(ctx)
    cleanup(ctx)
    bad = {r: f"health check: {f}" for r, f in facts.items() if not isinstance(f, dict)}
    rows = gpu.check(ctx, facts, busy=False) + storage.check_output(ctx, facts)
    rows += _gpu_expected(ctx, facts)
    for row in rows:
        if row.status == "fail" and row.node not in bad:
            bad[row.node] = f"health check: {row.check}: {row.detail}"
    return dict(sorted(bad.items()))


def _gpu_expected(ctx: Ctx, facts: dict) -> list[CheckResult]:
    """A fail row for each node without nvidia-smi while another node of the attempt has it."""
    has = {r: bool(f.get("gpu", {}).get("smi")) for r, f in facts.items() if isinstance(f, dict)}
    if not any(has.values()):
        return []
    return [CheckResult("gpu", r, ctx.nodes[r].host, "fail",
                        "no nvidia-smi here, while the other nodes have GPUs")
            for r, ok in has.items() if not ok]

"""Running the checklist: probe every node in parallel, judge each check, build the report."""
from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from ..errors import Problem
from ..transport.base import Executor
from ..plan.launch_plan import LaunchPlan
from ..spec import world_size
from ..spec.hosts import HostAddr, parse_host
from . import clock, collective, gpu, ifname, master, network, software, staged, storage
from .probe import Ctx, cleanup, gather_facts
from .report import CheckResult, Report, sort_results

# Checks that give one row per node (NODE0_ONLY: node 0 only), for the "no SSH" skips.
NODE0_ONLY = ("network/port-free", master.CHECK)
PER_NODE = ("software/python", "software/versions", "software/jit-lock", "gpu", *NODE0_ONLY,
            "network/port-reachable", "network/hostname", "network/ifname", "storage/output",
            "storage/shared", "storage/inputs", "clock", "container/shm")


def run_checks(plan: LaunchPlan, executor: Executor, *, fast_only: bool = False,
               printer=None) -> Report:
    """Every check on every node of plan; executor is connected and stays open.

    fast_only: everything but the all-reduce (what `submit` runs before it starts).
    printer: a launcher Printer for progress lines, or None for silence.
    """
    return run_ctx(Ctx(plan, executor, fast_only=fast_only), fast_only=fast_only, printer=printer)


def run_ctx(ctx: Ctx, *, fast_only: bool = False, printer=None) -> Report:
    """run_checks for a context that may already know of nodes SSH could not reach."""
    t0 = time.monotonic()
    n = len(ctx.nodes)
    _say(printer, f"preflight: checking {len(ctx.live)} of {n} node{'' if n == 1 else 's'}")
    results = ssh_rows(ctx)
    # The facts probe runs the mesh's first round too (network.first_round: it needs no
    # facts), beside the clock's first round; the clock's other rounds (clock.sample) go beside
    # a second mesh round, which follows only where the first proved less than a node's
    # advertised address (network.settle_mesh), and the cleanup.
    with ThreadPoolExecutor(max_workers=2) as pool:
        facts_job = pool.submit(gather_facts, ctx, network.first_round(ctx)) if ctx.live else None
        clock_job = pool.submit(clock.sample, ctx, rounds=1)
        facts = facts_job.result() if facts_job else {}
        clock_job = pool.submit(clock.sample, ctx, clock_job.result(), rounds=clock.SAMPLES - 1)
        mesh = network.settle_mesh(ctx, facts, network.first_results(ctx, facts)) if ctx.live else {}
        network.port_fact(ctx, facts, mesh)
        cleanup(ctx)
        samples = clock_job.result()
    results += judge(ctx, facts, mesh, samples)
    if not fast_only:   # `check` only: submit stages before its preflight
        results += staged.check(ctx)
    if not fast_only:
        results += _collective(ctx, results, printer)
    return Report(sort_results(results), time.monotonic() - t0,
                  stack=software.majority_stack(ctx, facts) if ctx.live else {},
                  memory=gpu.memory_facts(ctx, facts))


def judge(ctx: Ctx, facts: dict, mesh: dict, samples: dict) -> list[CheckResult]:
    """Every per-node row from what the probes brought back (pure: no node is contacted)."""
    out = software.check_python(ctx, facts) + software.check_versions(ctx, facts)
    out += software.check_ext_locks(ctx, facts) + software.check_pyspy(ctx, facts) + gpu.check(ctx, facts)
    if 0 in ctx.live:
        out += network.port_free(ctx, facts) + master.check(ctx, facts, mesh)
    out += network.port_reachable(ctx, mesh) + network.hostname(ctx, facts, mesh)
    out += ifname.check(ctx, facts)
    out += storage.check_output(ctx, facts) + storage.check_shared(ctx, facts, mesh)
    out += storage.check_inputs(ctx, facts) + clock.check(ctx, samples) + storage.check_shm(ctx, facts)
    for r in ctx.unreachable:
        out += [CheckResult(c, r, ctx.nodes[r].host, "skip", "not checked: no SSH")
                for c in PER_NODE if c not in NODE0_ONLY or r == 0]
    return out


def ssh_rows(ctx: Ctx) -> list[CheckResult]:
    """The ssh row: what connect() said about each host."""
    out = []
    for n in ctx.nodes:
        if n.rank in ctx.unreachable:
            port = _port(n.login, ctx.job.cluster.ssh.port)
            detail, fix = ssh_fix(n.host, ctx.unreachable[n.rank], port)
            out.append(CheckResult("ssh", n.rank, n.host, "fail", detail, fix))
        else:
            how = "local: no SSH needed" if ctx.plan.local else "connected and authenticated"
            out.append(CheckResult("ssh", n.rank, n.host, "pass", how))
    return out


def _port(login: str, default: int) -> int:
    a = parse_host(login)
    return (a.port or default) if isinstance(a, HostAddr) else default


def ssh_fix(host: str, message: str, port: int) -> tuple[str, str]:
    """Split connect()'s one-line explanation into what went wrong and the fix."""
    what, sep, how = message.partition("; ")
    if sep:
        return what, how
    low = message.lower()
    if "refused" in low:
        fix = f"start sshd on {host}, or open TCP {port} to it (firewall / security group)"
    elif "no answer" in low or "timed out" in low:
        fix = f"check that {host} is up and TCP {port} is open from this machine"
    elif "resolve" in low:
        fix = f"fix {host} in cluster.hosts, or add it to DNS / this machine's /etc/hosts"
    else:
        fix = f"make `ssh {host}` work from this machine (cluster.ssh settings), then rerun"
    return message.split(": is ")[0], fix


def _collective(ctx: Ctx, results: list[CheckResult], printer) -> list[CheckResult]:
    """The all-reduce (and the transport it used), unless a fast check shows it cannot start."""
    def failed(check: str) -> list[str]:
        return [f"node{r.node}" for r in results if r.check == check and r.status == "fail"]
    blocked = ("ssh", "software/python", "network/port-free", master.CHECK)
    why = next((f"{c} failed on {', '.join(failed(c))}" for c in blocked if failed(c)), None)
    if why:
        return [CheckResult("collective", None, None, "skip", f"not run: {why}")]
    world = world_size(ctx.job)
    _say(printer, f"preflight: all-reduce across {world} ranks (limit {ctx.pf.collective_timeout_s:g}s)")
    return collective.run(ctx)


def unreachable_ranks(plan: LaunchPlan, problems: list[Problem]) -> dict[int, str]:
    """connect()'s problems ("host <h>": why) by node rank."""
    by_host = {p.path.removeprefix("host "): p.message for p in problems}
    return {n.rank: by_host[n.login] for n in plan.nodes if n.login in by_host}


def _say(printer, line: str) -> None:
    """A progress line, when there is a printer."""
    if printer is not None:
        printer.say(line)

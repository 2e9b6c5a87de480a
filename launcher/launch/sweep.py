"""Reaching every node of a registered run directly and ending its processes.

Used by `mlaunch stop` after the supervisor has torn the run down (to prove nothing is
left) and instead of it when the supervisor is lost. Processes are found by the
MLAUNCH_RUN_ID of each attempt in their environment, never by name.
"""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

from .. import render
from .backend import Cancel
from ..execute.base import TEARDOWN_GRACE

LEFT = re.compile(r"mlaunch-teardown: (\d+) left")


def attempt_tags(run_id: str, attempts: int) -> list[str]:
    """The MLAUNCH_RUN_ID of every attempt (plan.build_plan's tagging)."""
    return [run_id] + [f"{run_id}.a{n}" for n in range(1, max(attempts, 1))]


def own_tags(run, tags: list[str]) -> tuple[list[str], list[str]]:
    """tags without those that are the id of another registered run (an older mlaunch let
    `--run-id X.a1` beside run X): sweeping X must never end that run's processes. A tag of
    an attempt X did record is then ambiguous: left alone, with a problem line saying so."""
    from ..record.registry import Registry
    reg = Registry()
    try:
        taken = {t for t in tags[1:] if reg.get(t) is not None}
    finally:
        reg.close()
    problems = [f"attempt {tags.index(t)}'s processes (MLAUNCH_RUN_ID={t}) were left alone: run "
                f"{t} has the same id; stop it with `mlaunch stop {t}` when it may end"
                for t in tags if t in taken and tags.index(t) < run.attempts]
    return [t for t in tags if t not in taken], problems


def sweep(run, kill_now: bool = False) -> Cancel:
    """TERM, grace, KILL for every attempt's processes on every host of run; what is left."""
    from ..plan.launch_plan import build_plan
    from ..spec.load import validate
    from ..execute.job import make_executor
    job = with_spares_used(validate(run.spec), run)  # the masked snapshot: enough to reach the hosts
    plan = build_plan(job, run_id=run.id, log_dir=run.log_dir, registered=True)
    executor = make_executor(plan)
    try:
        problems = executor.connect()
        if problems:
            return Cancel(problems=[str(p) for p in problems])
        hosts = list(dict.fromkeys(n.login for n in plan.nodes))
        # Restarts may have run up to max_restarts more attempts than the registry has seen.
        tags, problems = own_tags(run, attempt_tags(run.id, max(run.attempts, 1) + job.max_restarts + 1))
        with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
            outs = list(pool.map(lambda h: _host(executor, plan, h, tags, kill_now), hosts))
    finally:
        executor.close()
    result = Cancel(problems=problems)
    for host, (code, out) in zip(hosts, outs):
        counts = [int(n) for n in LEFT.findall(out)]
        if len(counts) != len(tags):
            result.problems.append(f"host {host}: teardown did not finish (exit {code}): "
                                   f"{out.strip()[-200:]}")
        result.left[host] = sum(counts)
    return result


def with_spares_used(job, run):
    """job whose hosts are every machine the run used: the spec's hosts and each spare that
    took a node's place in an attempt (the registry's attempts record their hosts); the spec
    alone names only the first attempt's."""
    from ..record.registry import Registry
    from ..spec.hosts import login_addr
    c = job.cluster
    if not c.spare_hosts or not c.hosts:
        return job
    reg = Registry()
    try:
        used = set(run.hosts or []).union(*(a.hosts or [] for a in reg.attempts(run.id)))
    finally:
        reg.close()
    spares = [s for s in c.spare_hosts if login_addr(s).name in used]
    if not spares:
        return job
    return job.model_copy(update={"cluster": c.model_copy(update={
        "hosts": [*c.hosts, *spares], "spare_hosts": []})})


def _host(executor, plan, host: str, tags: list[str], kill_now: bool) -> tuple[int, str]:
    # Every rank's pidfile: a spare took a lost node's rank (each is signalled only while its
    # leader's environment holds the run's tag: templates/teardown.sh.j2).
    pidfiles = sorted({n.pidfile for n in plan.nodes})
    script = "\n".join(render.teardown_script(f"MLAUNCH_RUN_ID={tag}", pidfiles, TEARDOWN_GRACE,
                                              kill_now) for tag in tags)
    return executor.run(host, script, timeout=TEARDOWN_GRACE * len(tags) + 20)

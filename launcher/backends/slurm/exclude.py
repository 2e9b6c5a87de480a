"""Before a Slurm restart: exclude the nodes that failed (issue 29, the Slurm variant).

Slurm picks the nodes, so there are no spare hosts under Slurm: the next sbatch gets
`--exclude` with every node of the last attempt that Slurm reports drained, down or failing,
whose task was lost, or whose output showed a hardware-looking cause (watch/hwcause.py),
added to the user's own extra_sbatch exclude and to those of earlier attempts (the job
carries them from attempt to attempt). When cluster.min_nodes allows it and
the exclusions leave fewer usable nodes in the partition than the job asks for, the next sbatch
asks for fewer (--nodes, down to min_nodes) with grad_accum recomputed (shrink.py's arithmetic).
"""
from __future__ import annotations

from ...session.attempt import JobResult
from ...errors import UserError
from ...watch import hwcause
from .commands import failed_nodes, hostnames, usable_nodes
from ...logs.stream import Printer
from ...record.events import EventLog
from ...spec import JobBase
from ...spec.select import node_procs
from ...runs import shrink


def failed(result: JobResult) -> dict[str, str]:
    """{node: why} of the last attempt's nodes that should not run the next one."""
    hosts = [o.host for o in result.nodes if o.exit is not None and o.host not in ("", "?")]
    bad = failed_nodes(hosts)
    for o in result.nodes:
        if o.exit is not None and o.exit.lost and not o.terminated and o.host in hosts:
            bad.setdefault(o.host, f"task lost ({o.exit.detail or 'no exit status'})")
    for rank, why in hwcause.of_result(result).items():
        if result.nodes[rank].host in hosts:
            bad.setdefault(result.nodes[rank].host, why)
    return bad


def exclude_failed(job: JobBase, result: JobResult, printer: Printer, events: EventLog) -> JobBase:
    """job with the last attempt's failed nodes added to cluster.slurm.extra_sbatch's exclude."""
    s = job.cluster.slurm
    bad = failed(result)
    if s is None or not bad:
        return job
    before = [n for n in str(s.extra_sbatch.get("exclude", "")).split(",") if n]
    new = [n for n in bad if n not in before]
    for name in new:
        events.emit("node_excluded", host=name, reason=bad[name])
        printer.say(f"slurm: the restart excludes {name} ({bad[name]})")
    if not new:
        return job
    extra = {**s.extra_sbatch, "exclude": ",".join(before + new)}
    slurm = s.model_copy(update={"extra_sbatch": extra})
    return job.model_copy(update={"cluster": job.cluster.model_copy(update={"slurm": slurm})})


def fit(job: JobBase, printer: Printer, events: EventLog) -> JobBase:
    """job asking for no more nodes than the partition has left outside --exclude (shrink),
    when cluster.min_nodes allows it; UserError (the run ends) when fewer than min_nodes are left."""
    if not shrink.allowed(job):
        return job
    s, want = job.cluster.slurm, len(node_procs(job.cluster))
    spec = str(s.extra_sbatch.get("exclude", ""))
    excluded = hostnames(spec) if spec else []
    found = usable_nodes(s.partition, excluded)
    if found is None or len(found[1]) >= want:
        return job
    part, usable = found
    lost = ", ".join(excluded) or "none"
    why = (f"excluded {lost}, which leaves {len(usable)} usable node(s) of the {want} asked in "
           f"partition {part}")
    if len(usable) < job.cluster.min_nodes:
        raise UserError(f"cluster.min_nodes: {job.cluster.min_nodes}: {why}; the run ends")
    return to_nodes(job, len(usable), lost, why, printer, events)


def to_nodes(job: JobBase, nodes: int, lost: str, why: str, printer: Printer,
             events: EventLog) -> JobBase:
    """job asking Slurm for `nodes` nodes (--nodes) with the accumulation for that world;
    lost: the excluded nodes, why: how they leave too few. UserError when the world misses
    the batch."""
    c = job.cluster
    slurm = c.slurm.model_copy(update={"nodes": nodes})
    new = job.model_copy(update={"cluster": c.model_copy(update={"slurm": slurm})})
    return shrink.resized(job, new, lost, why, printer, events)

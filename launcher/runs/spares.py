"""Before a restart: replace lost, unhealthy or unreachable nodes by cluster.spare_hosts, in order.

A node is replaced when the last attempt lost it (its connection dropped), when its output
showed a hardware-looking cause (watch/hwcause.py: an ECC error, a lost GPU, NCCL's
"unhandled system error" on the node that failed first; not a rank's plain non-zero exit),
when it cannot be reached now, or when it fails the host check (preflight/hostcheck.py: GPU,
disk) run on every host of the next attempt before it starts. The spare takes the
node's rank, so ranks stay contiguous and a surviving node 0 stays node 0; a replaced node 0
makes the spare the master (cluster.master_addr defaults to node 0). The world and the
batch stay what they were: every node runs the same processes (spare_rules.py). With no
spare left for a node and cluster.min_nodes below the node count, shrink.py drops it instead.
"""
from __future__ import annotations

from ..errors import UserError
from ..watch import hwcause
from ..session.attempt import JobResult
from ..logs.stream import Printer
from ..watch.watch import world_size
from ..plan.launch_plan import LaunchPlan
from ..preflight.hostcheck import unfit_hosts
from ..record.events import EventLog
from ..spec import JobBase
from . import shrink


def lost_ranks(result: JobResult) -> dict[int, str]:
    """{rank: why} of the nodes whose connection dropped on their own (not in mlaunch's teardown)."""
    return {o.rank: o.exit.detail or "connection lost" for o in result.nodes
            if o.exit is not None and o.exit.lost and not o.terminated}


def reconnect(job: JobBase, plan: LaunchPlan, result: JobResult, printer: Printer,
              events: EventLog, rebuild, transport) -> tuple[JobBase, LaunchPlan, object]:
    """Connect to every host of the next attempt and check its health (hostcheck.py),
    replacing bad nodes by spares (or dropping them, shrink.py) until every host passes.

    rebuild(job): the attempt's plan for a job (the same run id and log dir); transport(plan):
    the backend's unconnected transport to a plan's hosts. Returns the job
    (its hosts the next attempt's), that plan and the connected executor; raises UserError
    when a node is unreachable or unfit and no spare is left (nothing is started anywhere):
    below cluster.min_nodes, the min_nodes line naming every node lost on the way."""
    bad = {**hwcause.of_result(result), **lost_ranks(result)}
    lost = _Lost(job)
    while True:
        left = {r: bad[r] for r in sorted(bad)[len(job.cluster.spare_hosts):]}
        job = _replace(job, plan, bad, printer, events)
        if left and shrink.allowed(job):   # no spare for these: run without them
            if len(job.cluster.hosts) - len(left) < job.cluster.min_nodes:
                raise lost.refusal(job, left)
            lost.add(job, left)
            job = shrink.drop(job, left, printer, events)
        plan = rebuild(job)
        executor = transport(plan)
        problems = executor.connect()
        if not problems:
            bad = unfit_hosts(plan, executor)
            if not bad:
                return job, plan, executor
            _not_every_host(plan, bad, "fails its health check", executor)
            executor.close()
            _stuck(job, lost, bad, UserError(
                [f"node{r} {plan.nodes[r].host}: {why}" for r, why in bad.items()],
                header="a host of the next attempt fails its health check and no spare host "
                "is left; nothing was started anywhere:"))
            continue
        executor.close()
        bad = _unreachable(plan, problems)
        _not_every_host(plan, bad, "cannot be reached", executor)
        _stuck(job, lost, bad, UserError(problems, header="cannot reach every host and no "
                                         "spare host is left; nothing was started anywhere:"))


class _Lost:
    """The nodes a reconnect dropped or cannot use, each named by its rank in the attempt
    that ran (the ranks its console showed), for the min_nodes line."""

    def __init__(self, job: JobBase):
        self.first, self.seen = list(job.cluster.hosts), []

    def add(self, job: JobBase, bad: dict[int, str]) -> None:
        for r, why in bad.items():
            host = job.cluster.hosts[r]
            self.seen.append((self.first.index(host) if host in self.first else r, host, why))

    def refusal(self, job: JobBase, bad: dict[int, str]) -> UserError:
        """The min_nodes line: the nodes lost before and `bad` now, and how many are left."""
        left = len(job.cluster.hosts) - len(bad)
        self.add(job, bad)
        named = "; ".join(f"node{r} {h} ({why})" for r, h, why in sorted(self.seen))
        return shrink.below_min(job.cluster.min_nodes, named, left)


def _stuck(job: JobBase, lost: _Lost, bad: dict[int, str], otherwise: UserError) -> None:
    """Raise when the bad nodes can be neither replaced (no spare left) nor dropped: the
    min_nodes line when min_nodes is what stops the drop, else `otherwise`."""
    if bad and (job.cluster.spare_hosts or shrink.allowed(job)):
        return
    raise lost.refusal(job, bad) if bad and job.cluster.min_nodes else otherwise


def _not_every_host(plan: LaunchPlan, bad: dict[int, str], what: str, executor) -> None:
    """Raise when every node of a multi-node attempt fails the same way (the same check, or
    all unreachable): that is the launcher's network, the shared storage or the check, not
    the hosts, and replacing each by a spare would only use the spares up."""
    kinds = {":".join(why.split(":")[:2 if why.startswith("health check") else 1]) for why in bad.values()}
    if len(plan.nodes) < 2 or len(bad) < len(plan.nodes) or len(kinds) > 1:
        return
    executor.close()
    raise UserError([f"node{r} {plan.nodes[r].host}: {why}" for r, why in sorted(bad.items())],
                    header=f"every host of the next attempt {what}: the cause is shared (this "
                    "machine's network, the storage, the environment), not one host, so no spare "
                    "was used; fix it and resubmit (the checkpoints are kept); nothing was "
                    "started anywhere:")


def _unreachable(plan: LaunchPlan, problems) -> dict[int, str]:
    """{rank: the connect problem} for every node whose login failed to connect."""
    why = {p.path.removeprefix("host "): p.message for p in problems}
    return {n.rank: f"unreachable: {why[n.login]}" for n in plan.nodes if n.login in why}


def _replace(job: JobBase, plan: LaunchPlan, bad: dict[int, str], printer: Printer,
             events: EventLog) -> JobBase:
    """job with each bad node's host replaced by the next spare (as many as there are)."""
    c = job.cluster
    hosts, spares = list(c.hosts), list(c.spare_hosts)
    if not bad or not spares:
        return job
    if 0 in bad and c.master_addr is not None:
        raise UserError(f"cluster.master_addr: {c.master_addr} is node 0 ({hosts[0]}), which is "
                        f"lost ({bad[0]}); a spare cannot take node 0's place while master_addr "
                        "names it: leave master_addr out (it follows node 0) and submit again")
    world = world_size(plan)
    for rank in sorted(bad)[:len(spares)]:
        old, new = hosts[rank], spares.pop(0)
        hosts[rank] = new
        events.emit("host_replaced", rank=rank, old_host=old, new_host=new, reason=bad[rank],
                    spares_left=len(spares))
        printer.say(f"host replaced: node{rank} {old} -> spare {new} ({bad[rank]}); the world "
                    f"stays {world} processes" + ("; node 0 is the new master" if rank == 0 else ""))
    return job.model_copy(update={"cluster": c.model_copy(update={"hosts": hosts,
                                                                 "spare_hosts": spares})})


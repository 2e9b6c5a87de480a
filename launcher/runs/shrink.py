"""Before a restart with no spare left: drop the lost nodes, down to cluster.min_nodes.

The next attempt runs on the healthy hosts, in their old order (ranks contiguous; node 0
stays node 0 when it is healthy, else the next host becomes node 0 and the master). The
global batch is kept by recomputing grad_accum (launcher/plan/shrink.py); a world that does
not divide it ends the run with the node counts that would. A scheduler's backend asks for
fewer nodes with the same arithmetic (resized).
"""
from __future__ import annotations

from ..errors import UserError
from ..logs.stream import Printer
from ..plan import shrink as arith
from ..plan.trainers import global_batch
from ..record.events import EventLog
from ..spec import JobBase, LlamaFactoryJob, SwiftJob, world_size
from ..spec.select import node_procs
from ..spec.spare_rules import shrinks


def allowed(job: JobBase) -> bool:
    """Whether this job may restart on fewer nodes (cluster.min_nodes below the node count)."""
    return shrinks(job.cluster)


def drop(job: JobBase, bad: dict[int, str], printer: Printer, events: EventLog) -> JobBase:
    """job without the hosts of the `bad` ranks and with the accumulation for the new world;
    UserError (nothing started) when below min_nodes or the new world misses the batch."""
    c = job.cluster
    hosts = [h for r, h in enumerate(c.hosts) if r not in bad]
    lost = "; ".join(f"node{r} {c.hosts[r]} ({why})" for r, why in sorted(bad.items()))
    if len(hosts) < c.min_nodes:
        raise below_min(c.min_nodes, lost, len(hosts))
    if 0 in bad and c.master_addr is not None:
        raise UserError(f"cluster.master_addr: {c.master_addr} is node 0 ({c.hosts[0]}), which "
                        f"is lost ({bad[0]}); a shrink cannot move the master while master_addr "
                        "names it: leave master_addr out (it follows node 0) and submit again")
    update = {"hosts": hosts}
    devs = c.cuda_visible_devices
    if devs and isinstance(devs[0], list):   # one list per node: each stays with its host
        update["cuda_visible_devices"] = [d for r, d in enumerate(devs) if r not in bad]
    new = job.model_copy(update={"cluster": c.model_copy(update=update)})
    return resized(job, new, lost, f"lost {lost}", printer, events)


def below_min(min_nodes: int, lost: str, left: int) -> UserError:
    """The one line that ends a run with fewer than min_nodes usable nodes; lost: every node
    lost ("node1 h1 (why); node2 h2 (why)"), left: how many are usable."""
    return UserError(f"cluster.min_nodes: {min_nodes}: lost {lost}, which leaves {left} "
                     "node(s) and no spare host; the run ends")


def resized(job: JobBase, new: JobBase, lost: str, why: str, printer: Printer,
             events: EventLog) -> JobBase:
    """new (fewer nodes) with the global batch kept; the shrink event (lost: what was lost)
    and its console line (why: the same, told)."""
    old_world, new_world = world_size(job), world_size(new)
    nodes = len(node_procs(new.cluster))
    head = (f"shrink: {why}; the next attempt runs on {nodes} nodes, world {old_world} -> "
            f"{new_world} processes")
    if not isinstance(job, (LlamaFactoryJob, SwiftJob)):
        events.emit("shrink", old_world=old_world, new_world=new_world, nodes=nodes, lost=lost)
        printer.say(head)
        return new
    b, gb, c = job.batch, global_batch(job), job.cluster
    ga = arith.regrad(gb, new_world, b.per_device)
    if ga is None:
        table = arith.sizes(node_procs(c)[0], len(node_procs(c)), c.min_nodes, gb, b.per_device)
        size = next(s for s in table if s.world == new_world)
        raise UserError(f"{why}: " + arith.refusal(size, gb, b.per_device, table))
    events.emit("shrink", old_world=old_world, new_world=new_world, nodes=nodes,
                old_grad_accum=b.grad_accum, new_grad_accum=ga, global_batch=gb, lost=lost)
    printer.say(f"{head}, grad_accum {b.grad_accum} -> {ga}, global batch {gb} = {new_world} × "
                f"{b.per_device} per device × {ga} (kept)")
    return new.model_copy(update={"batch": b.model_copy(update={"grad_accum": ga})})

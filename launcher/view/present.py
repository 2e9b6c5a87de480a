"""Human-readable views of a plan and of a finished job. Everything printed is masked."""
from __future__ import annotations

from . import memview
from .staging import staging_lines
from ..plan.launch_plan import LaunchPlan
from ..spec import LlamaFactoryJob, SwiftJob, node_procs, world_size, world_text
from ..spec.select import world_factor
from ..spec.hosts import HostAddr, parse_host
from ..plan.trainers import TRAINERS, global_batch


def describe_plan(plan: LaunchPlan, full: bool = False, with_nodes: bool = True,
                  placed: tuple[str, ...] = (), list_code=None, reach=None,
                  shrink_how: str | None = None) -> str:
    """The dry-run view: header, the nodes (a readable summary, or with full every node's
    exact script), then every file (with_nodes False: the header only, for a scheduler
    backend's own view). The backend's own words: placed, its lines on how it places the
    nodes; list_code, its lister of a code item's files (view/staging.py); reach, how it
    reaches a node's login (default: ssh, or none for local); shrink_how, how its restart
    runs on fewer nodes (default: the healthy hosts of the list)."""
    job = plan.job
    size = world_size(job)
    lines = [f"mlaunch plan: job {job.name}, run {plan.run_id}",
             f"world: {world_text(job.cluster, 'processes')}"
             + (f" = {size}" if len(set(node_procs(job.cluster))) <= 1 else "")]
    lines += [f"note: {n}" for n in job._notes]
    if isinstance(job, SwiftJob) and job.megatron:
        b, m = job.batch, job.megatron
        dp = size // (m.tp * m.pp * m.cp)
        lines.append(f"megatron: tp {m.tp} × pp {m.pp} × cp {m.cp} × dp {dp} = {size}"
                     + (f"; experts: ep {m.ep} × etp {m.etp}" if m.ep * m.etp > 1 else ""))
        lines.append(f"global batch: {dp * b.per_device * b.grad_accum} = dp {dp} × "
                     f"{b.per_device} per device × {b.grad_accum} accumulation")
    elif isinstance(job, (LlamaFactoryJob, SwiftJob)):
        b = job.batch
        lines.append(f"global batch: {global_batch(job)} = {world_factor(job.cluster)} × "
                     f"{b.per_device} per device × {b.grad_accum} accumulation")
    if plan.batch is not None:
        lines += memview.lines(plan.batch)
    where = "shared storage" if plan.shared else "uploaded to each node"
    lines.append(f"files: {plan.run_dir} ({where})")
    lines.append(f"logs: {plan.log_dir}")
    if plan.resume_from:
        lines.append(f"resume from: {plan.resume_from}")
    notes = getattr(TRAINERS[job.trainer], "notes", None)
    lines += [f"note: {n}" for n in (notes(job) if notes else [])]
    lines.append(restart_line(job))
    lines += spare_lines(job) + shrink_lines(job, shrink_how)
    lines += staging_lines(job, len(plan.nodes), list_code)
    lines += list(placed)
    if not with_nodes:
        return plan.mask("\n".join(lines) + "\n")
    reach = reach or (lambda login: _how(plan, login))
    if not full:
        from .dryrun import node_lines
        lines += node_lines(plan, lambda node: reach(node.login))
    for node in plan.nodes if full else ():
        lines += ["", f"=== node {node.rank}: {node.host} ({reach(node.login)}) ===",
                  node.display.rstrip("\n")]
        if node.warm:   # made from the masked environment (and masked below, with the rest)
            lines += ["", f"=== node {node.rank}: its session's warm frame, run at login (cluster.warm_start) ==="]
            lines.append(node.warm_display if node is plan.nodes[0] else
                         "node 0's, with this node's environment (its exports above)")
    for f in plan.files:
        lines += ["", f"=== file {f.path} ==="]
        lines += [f"# {line}" for line in (f.note or "").splitlines()]
        lines.append(f.content.rstrip("\n"))
    return plan.mask("\n".join(lines) + "\n")


def restart_line(job) -> str:
    """mlaunch's own restart policy (torchrun's --max-restarts 0 on the node line means torchrun
    never restarts a rank itself; mlaunch relaunches every node, from a checkpoint)."""
    if not job.max_restarts:
        return ("restarts: none (max_restarts 0): a node failure ends the run (max_restarts: N, or "
                "--max-restarts N, relaunches every node; torchrun's own --max-restarts stays 0)")
    how = ("the latest complete checkpoint" if TRAINERS[job.trainer].resumable
           else "scratch (this trainer writes no checkpoint mlaunch can resume)")
    return (f"restarts: up to {job.max_restarts} (max_restarts), each {job.restart_backoff_s:g}s "
            f"after a node failure (restart_backoff_s), every node relaunched from {how}")


def spare_lines(job) -> list[str]:
    """The spare-host policy (launcher/runs/spares.py), when cluster.spare_hosts names any."""
    c = job.cluster
    if not c.spare_hosts:
        return []
    size, gb = world_size(job), global_batch(job) if isinstance(job, (LlamaFactoryJob, SwiftJob)) else None
    keep = f"the world ({size}) " + (f"and the global batch ({gb}) stay" if gb else "stays")
    master = ("a replaced node 0's spare becomes the master" if c.master_addr is None else
              f"node 0 cannot be replaced: cluster.master_addr {c.master_addr} is given")
    unused = "" if job.max_restarts else "; max_restarts is 0, so no restart will use them"
    return [f"spare hosts, in order: {', '.join(c.spare_hosts)}: before a restart each node lost "
            "in the last attempt (connection lost or a hardware-looking error), unreachable now, "
            "or failing the host check (GPU, disk) takes the next one, with its rank; "
            f"{keep} the same; {master}{unused}"]


HOSTS_SHRINK = ("a node lost with no spare left is dropped and the restart runs on the healthy "
                "hosts (node 0 kept when healthy)")


def shrink_lines(job, how: str | None = None) -> list[str]:
    """The shrink policy (launcher/runs/shrink.py) and the batch at each allowed node count;
    how: the backend's words for its smaller restart (default: a host list's)."""
    from ..plan import shrink
    from ..spec.select import node_procs
    from ..spec.spare_rules import shrinks
    c = job.cluster
    if not shrinks(c):
        return []
    procs = node_procs(c)
    n = len(procs)
    unused = "" if job.max_restarts else "; max_restarts is 0, so no restart will shrink"
    lines = [f"elastic shrink: down to {c.min_nodes} nodes (cluster.min_nodes), world "
             f"{c.min_nodes * procs[0]}: {how or HOSTS_SHRINK}" + unused]
    if not isinstance(job, (LlamaFactoryJob, SwiftJob)):
        return lines
    if getattr(job, "deepspeed", None):
        lines.append("  a ZeRO checkpoint saved at another world is converted once on node 0 "
                     "(ds_to_universal) and loaded with checkpoint.load_universal")
    gb, pd = global_batch(job), job.batch.per_device
    for s in shrink.sizes(procs[0], n, c.min_nodes, gb, pd):
        lines.append(f"  at {s.nodes} nodes: global batch {gb} = world {s.world} × {pd} per "
                     f"device × {s.grad_accum} accumulation" if s.grad_accum else
                     f"  at {s.nodes} nodes: refused: global batch {gb} is not a multiple of "
                     f"world {s.world} × {pd} per device (per_device is never raised)")
    return lines


def _how(plan: LaunchPlan, login: str) -> str:
    if plan.local:
        return "local, no ssh"
    ssh = plan.job.cluster.ssh
    a = parse_host(login)
    a = a if isinstance(a, HostAddr) else HostAddr(login)
    user = a.user or ssh.user
    via = f" via {ssh.jump_host}" if ssh.jump_host else ""
    return f"ssh {HostAddr(a.name, user, a.port or ssh.port).login}{via}"


def describe_result(plan: LaunchPlan, result) -> str:
    """The end-of-job summary: one row per node, then the last lines of each failed node."""
    width = max(len(n.host) for n in result.nodes)
    rows = [f"{'node':<5} {'host':<{width}} result"]
    rows += [f"{n.rank:<5} {n.host:<{width}} {n.result}" for n in result.nodes]
    failed = [n for n in result.nodes if n.exit and (n.exit.code or n.exit.lost) and not n.terminated]
    for n in failed:
        rows.append(f"--- node{n.rank} {n.host}: last lines ---")
        rows += [f"  {line}" for line in n.tail] or ["  (no output)"]
    left = {h: t for h, t in result.teardown.items() if not t.endswith(" 0 left")}
    for host, text in left.items():
        rows.append(f"teardown on {host}: {text}")
    verdict = ("interrupted" if result.interrupted else "timed out" if result.timed_out
               else "failed" if result.code else "succeeded")
    rows.append(f"job {plan.run_id} {verdict} (exit {result.code}); logs: {plan.log_dir}")
    return plan.mask("\n".join(rows))

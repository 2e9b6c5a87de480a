"""Network checks: the master port, node-to-node reachability, hostnames, socket interfaces.

The seeds' two classic failures: "ssh worked, 29500 did not" (a firewall between the
workers and the master port) and NCCL/gloo advertising a loopback address because the
hostname resolves to 127.x in /etc/hosts. Both are tested by really listening and dialing.
"""
from __future__ import annotations

import ipaddress
import random

from ..spec.hosts import machine_key
from .probe import Ctx, on_nodes, py_script
from .report import CheckResult

MESH_WINDOW_S = 8.0   # how long dialers retry: listeners on slow nodes start late
FIRST_PORTS = (20000, 32768)   # round one's listening ports are drawn from here (first_ports)
NO_RENDEZVOUS = "not needed: one process without torchrun binds no master_port"


def is_loopback(addr: str) -> bool:
    """127.0.0.0/8 and ::1 (a hostname that maps there is useless to the other nodes)."""
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return False


def advertised(facts: dict | str | None) -> str | None:
    """The address node ranks advertise: the first one their hostname resolves to."""
    host = facts.get("host", {}) if isinstance(facts, dict) else {}
    addrs = host.get("addrs") or []
    return addrs[0] if addrs else None


def first_ports(ctx: Ctx) -> dict[int, int]:
    """Round one's listening port of each live node, picked here (distinct: nodes may share a
    machine) below Linux's ephemeral range (32768-60999), which outgoing connections draw from."""
    picks = random.Random(ctx.nonce).sample(range(*FIRST_PORTS), len(ctx.live) + 1)
    return dict(zip(ctx.live, [p for p in picks if p != ctx.master_port]))


def plans(ctx: Ctx, dialers: list[int], targets: dict[int, tuple[str, int]], master: bool,
          shared: bool) -> dict[int, dict]:
    """Per dialer: which ports it listens on and what it dials, for one simultaneous run.
    targets: rank -> (address, port) of its reachability listener; master: node 0 listens on
    master_port and every dialer dials master_addr (round one); shared: the shared_dir markers."""
    names = {str(i): ctx.shared_name(i) for i in ctx.live} if shared and ctx.job.cluster.shared_dir else None
    out = {}
    for r in dialers:
        listen = []
        if master and r == 0 and ctx.rendezvous:
            listen.append({"key": "master", "port": ctx.master_port, "expect": len(dialers)})
        if r in targets:
            listen.append({"key": "mesh", "port": targets[r][1], "expect": len(set(dialers) - {r})})
        dials = ([{"key": "master", "addr": ctx.master_addr, "port": ctx.master_port, "expect": 0}]
                 if master and ctx.rendezvous else [])
        dials += [{"key": f"node{i}", "addr": a, "port": p, "expect": i}
                  for i, (a, p) in targets.items() if i != r]
        out[r] = {"rank": r, "nonce": ctx.nonce, "listen": listen, "dials": dials,
                  # dialers retry for the window; the probe ends within window + 2 s
                  "window": min(MESH_WINDOW_S, ctx.pf.check_timeout_s / 3), "shared": names}
    return out


def first_round(ctx: Ctx) -> dict[int, dict]:
    """Round one's plans, run inside each node's facts probe (they need none of its answers):
    every node listens on a port picked here and is dialed at the address SSH reached it by;
    node 0 also listens on master_port (the port-free row's answer, port_fact) and every node
    dials master_addr. One process and one session a node for both, at the same time."""
    targets = ({r: (ctx.nodes[r].host, p) for r, p in first_ports(ctx).items()}
               if len(ctx.nodes) > 1 else {})
    return plans(ctx, ctx.live, targets, master=True, shared=True)


def first_results(ctx: Ctx, facts: dict[int, dict | str]) -> dict[int, dict | str]:
    """Round one's answers, taken out of each node's facts (or why a node has none)."""
    out: dict[int, dict | str] = {}
    for r in ctx.live:
        f = facts.get(r)
        got = f.pop("mesh", None) if isinstance(f, dict) else None
        out[r] = got if isinstance(got, dict) and "listen" in got else f"mesh probe failed ({_why(f, got)})"
    return out


def _why(f, got) -> str:
    """Why a node's facts hold no mesh answer."""
    if isinstance(f, str):
        return f
    if isinstance(got, dict) and got.get("error"):   # the mesh's thread raised, or ran past the budget
        return got["error"]
    return "no interpreter" if isinstance(f, dict) and f.get("nopython") else "no answer"


def settle_mesh(ctx: Ctx, facts: dict[int, dict | str], mesh: dict[int, dict | str]) -> dict[int, dict | str]:
    """Round two, only for the nodes round one did not prove reachable at the address their
    hostname resolves to (what NCCL and gloo advertise): dialed there, on the free port their
    facts probe found, by every node with an interpreter (the mesh program, nodeprog/mesh.py);
    their rows are then judged on it."""
    redo = {r: (advertised(facts[r]), facts[r]["mesh_port"]["port"]) for r in ctx.live
            if _unproven(ctx, r, facts.get(r), mesh)}
    if not redo:
        return mesh
    dialers = [r for r in ctx.live if isinstance(facts.get(r), dict) and not facts[r].get("nopython")]
    again = _run(ctx, plans(ctx, dialers, redo, master=False, shared=False))
    out = dict(mesh)
    for j, m in again.items():
        if not isinstance(m, dict):
            continue
        old = out.get(j) if isinstance(out.get(j), dict) else {"listen": {}, "dials": {}, "shared": {}}
        dials = {k: v for k, v in old["dials"].items() if k not in {f"node{r}" for r in redo}}
        listen = {**old["listen"], **({"mesh": m["listen"]["mesh"]} if "mesh" in m["listen"] else {})}
        out[j] = {**old, "dials": {**dials, **m["dials"]}, "listen": listen}
    return out


def _unproven(ctx: Ctx, r: int, f, mesh: dict) -> bool:
    """Round one left node r's reachability at its advertised address unproven: its listener
    did not run, or some dialer did not reach it, or reached it at another address."""
    addr = advertised(f)
    port = f.get("mesh_port", {}).get("port") if isinstance(f, dict) else None
    if len(ctx.nodes) < 2 or not addr or not port or is_loopback(addr):
        return False   # nothing to dial (the hostname row says why)
    own = mesh.get(r)
    heard = own.get("listen", {}).get("mesh") if isinstance(own, dict) else None
    if not heard or not heard.get("ok"):
        return True
    for j, m in mesh.items():
        d = m.get("dials", {}).get(f"node{r}") if isinstance(m, dict) and j != r else None
        if isinstance(m, dict) and j != r and not (d and d["ok"] and d.get("peer") == r and d.get("ip") == addr):
            return True
    return False


def _run(ctx: Ctx, plan: dict[int, dict]) -> dict[int, dict | str]:
    """Every planned node listens and dials at once; each node's JSON, or why it has none."""
    outs = on_nodes(ctx, lambda r: py_script(ctx, r, "mesh", plan[r]) if r in plan else None,
                    ctx.pf.check_timeout_s, ranks=list(plan))
    return {r: (o.json() or f"mesh probe failed ({o.why()})") for r, o in outs.items()}


def port_fact(ctx: Ctx, facts: dict[int, dict | str], mesh: dict[int, dict | str]) -> None:
    """Node 0's port fact (port_free reads it) from its master listener in round one: the bind
    that tests master_port is the one the listener made (a separate test would race it)."""
    f, m = facts.get(0), mesh.get(0)
    heard = m.get("listen", {}).get("master") if isinstance(m, dict) else None
    if isinstance(f, dict) and heard is not None:
        f["port"] = ({"free": True} if heard.get("ok") else
                     {"free": False, "error": heard.get("error", ""), "holder": heard.get("holder")})
    elif isinstance(f, dict) and ctx.rendezvous and isinstance(m, str):
        f["port_why"] = m


def port_free(ctx: Ctx, facts: dict) -> list[CheckResult]:
    """master_port must be free on node 0, where torchrun's rendezvous store will bind it."""
    host, port = ctx.nodes[0].host, ctx.master_port
    f = facts.get(0)
    if not ctx.rendezvous:
        return [CheckResult("network/port-free", 0, host, "skip", NO_RENDEZVOUS)]
    if not isinstance(f, dict) or "port" not in f:
        return [_skip("network/port-free", ctx, 0, f.get("port_why", f) if isinstance(f, dict) else f)]
    p = f["port"]
    if p.get("free"):
        return [CheckResult("network/port-free", 0, host, "pass", f"TCP {port} is free")]
    h = p.get("holder") or {}
    who = f"{h['name']} (pid {h['pid']})" if h.get("pid") else "another process"
    return [CheckResult(
        "network/port-free", 0, host, "fail", f"TCP {port} is in use by {who}: {p.get('error', '')}",
        (f"stop {who} on {host} (a leftover run? kill {h['pid']})" if h.get("pid") else
         f"free TCP {port} on {host} (see: ss -ltnp 'sport = :{port}')")
        + ", or set cluster.master_port to a free port")]


def port_reachable(ctx: Ctx, mesh: dict) -> list[CheckResult]:
    """Every node (the master included: it is a client of its own store) reaches master_addr:master_port."""
    addr, port = ctx.master_addr, ctx.master_port
    master = mesh.get(0, {}) if isinstance(mesh.get(0), dict) else {}
    heard = master.get("listen", {}).get("master", {})
    out = []
    for r in ctx.live:
        m = mesh.get(r)
        host = ctx.nodes[r].host
        if not ctx.rendezvous:
            out.append(CheckResult("network/port-reachable", r, host, "skip", NO_RENDEZVOUS))
            continue
        d = m.get("dials", {}).get("master") if isinstance(m, dict) else None
        if d is None:
            out.append(_skip("network/port-reachable", ctx, r, m))
        elif d["ok"] and d.get("peer") is None and heard.get("ok"):
            # node 0's listener held the port, so whatever answered is not on node 0
            out.append(CheckResult(
                "network/port-reachable", r, host, "fail",
                f"{addr}:{port} answered {host}, but not node 0's listener: the address leads "
                "to another machine or a proxy",
                "point cluster.master_addr at node 0 (see network/master-addr)"))
        elif d["ok"]:
            who = "" if d.get("peer") == 0 else " (answered by the process holding the port)"
            out.append(CheckResult("network/port-reachable", r, host, "pass",
                                   f"reached {addr}:{port} in {d['ms']:g} ms{who}"))
        else:
            extra = "" if heard.get("ok") or not heard else f"; the master could not listen: {heard.get('error')}"
            out.append(CheckResult(
                "network/port-reachable", r, host, "fail",
                f"cannot connect to {addr}:{port} from {host}: {d['error']}{extra}",
                f"open TCP {port} on {addr} to the workers (security group / firewall)"
                + (" and check the route between them" if "route" in d["error"].lower() else
                   f"; no route leads to {addr} from {host}: is it node 0's cluster address?"
                   if "unreachable" in d["error"].lower() else "")))
    return out


def hostname(ctx: Ctx, facts: dict, mesh: dict) -> list[CheckResult]:
    """Each hostname resolves to a non-loopback address that every other node can reach."""
    out = []
    for r in ctx.live:
        f = facts.get(r)
        if not isinstance(f, dict) or "host" not in f or "hostname" not in f["host"]:
            out.append(_skip("network/hostname", ctx, r, f))
            continue
        out.append(_hostname_one(ctx, r, f["host"], mesh))
    return out


def _hostname_one(ctx: Ctx, r: int, h: dict, mesh: dict) -> CheckResult:
    """The hostname row of node r: resolves, not loopback, reached by every peer."""
    host, name = ctx.nodes[r].host, h["hostname"]
    mine = _own_address(ctx, r, h)
    add = f"add `{mine} {name}` to /etc/hosts on every node"
    if len({machine_key(n.host) for n in ctx.nodes}) == 1:
        return CheckResult("network/hostname", r, host, "pass", f"{name}: one host, loopback is fine")
    if h.get("error"):
        return CheckResult("network/hostname", r, host, "fail", f"{name} does not resolve: {h['error']}", add)
    addr = h["addrs"][0]
    if is_loopback(addr):
        return CheckResult("network/hostname", r, host, "fail",
                           f"{name} resolves to {addr} (loopback): NCCL/gloo would advertise it "
                           "to the other nodes",
                           f"{add} (and remove the {addr} {name} line)")
    bad = []
    for j in ctx.live:
        d = mesh.get(j, {}).get("dials", {}).get(f"node{r}") if isinstance(mesh.get(j), dict) else None
        if j != r and d is not None and not (d["ok"] and d.get("peer") == r):
            bad.append(f"node{j}: {d.get('error') or 'answered by another machine or process'}")
    if bad:
        return CheckResult("network/hostname", r, host, "fail",
                           f"{name} → {addr} is not reachable ({'; '.join(bad)})",
                           f"allow TCP on all ports between the nodes (NCCL/gloo use ephemeral ports), "
                           f"and make {name} resolve to its cluster address: {add}")
    listened = mesh.get(r, {}).get("listen", {}).get("mesh") if isinstance(mesh.get(r), dict) else None
    if listened is None or not listened.get("ok"):
        return CheckResult("network/hostname", r, host, "skip",
                           f"{name} → {addr}; reachability not tested" +
                           (f": {listened.get('error')}" if listened else ""))
    return CheckResult("network/hostname", r, host, "pass", f"{name} → {addr}, reachable from every node")


def _own_address(ctx: Ctx, r: int, h: dict) -> str:
    """The node's cluster address for a hosts line: what SSH reached, else a non-lo interface."""
    if h.get("ssh_ip"):
        return h["ssh_ip"]
    host = ctx.nodes[r].host
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    addrs = [a for n, i in h.get("ifaces", {}).items() for a in i["addrs"] if n != "lo" and i["up"]]
    return addrs[0] if addrs else "<ip>"


def _skip(check: str, ctx: Ctx, r: int, why) -> CheckResult:
    """A – row carrying why the node has no data for the check."""
    text = why if isinstance(why, str) else "no facts from this node"
    return CheckResult(check, r, ctx.nodes[r].host, "skip", text)

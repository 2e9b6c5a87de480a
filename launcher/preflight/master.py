"""The master address: does cluster.master_addr (or hosts[0]) lead to node 0?

torchrun's rendezvous store listens on node 0 and every rank, node 0's included, dials
master_addr:master_port. An address that is not node 0's makes every rank retry the store
for the whole rendezvous timeout (15 min), or, where something else answers there (a
proxy, another machine), fail later and stranger. Node 0 answers this itself: the facts
probe binds each address master_addr resolves to (only a local address binds).
"""
from __future__ import annotations

from .probe import Ctx
from .report import CheckResult

CHECK = "network/master-addr"
NO_RENDEZVOUS = "not needed: one process without torchrun has no rendezvous"


def check(ctx: Ctx, facts: dict, mesh: dict) -> list[CheckResult]:
    """Node 0's row: master_addr resolves to one of node 0's own addresses."""
    host = ctx.nodes[0].host
    if not ctx.rendezvous:
        return [CheckResult(CHECK, 0, host, "skip", NO_RENDEZVOUS)]
    f = facts.get(0)
    m = f.get("master") if isinstance(f, dict) else None
    if not isinstance(m, dict) or not ("own" in m or "error" in m):
        why = f if isinstance(f, str) else (m or {}).get("error") or "no master address facts from node 0"
        return [CheckResult(CHECK, 0, host, "skip", why)]
    addr = ctx.master_addr
    if m.get("own"):
        to = "" if m["own"] == [addr] else f" → {', '.join(m['own'])}"
        return [CheckResult(CHECK, 0, host, "pass", f"{addr}{to}: node 0's own address")]
    if _reached_itself(mesh):   # NAT or port forwarding back to node 0: proven by the nonce
        return [CheckResult(CHECK, 0, host, "pass",
                            f"{addr} is not on node 0's interfaces, but leads to node 0 "
                            "(its own listener answered there)")]
    return [_fail(ctx, f, m)]


def _reached_itself(mesh: dict) -> bool:
    """Node 0's dial to master_addr:master_port reached node 0's own preflight listener."""
    m0 = mesh.get(0)
    d = m0.get("dials", {}).get("master") if isinstance(m0, dict) else None
    return bool(d and d.get("ok") and d.get("peer") == 0)


def _fail(ctx: Ctx, f: dict, m: dict) -> CheckResult:
    """The ✗ row: what master_addr is, node 0's real addresses, and how to pick one."""
    host, addr = ctx.nodes[0].host, ctx.master_addr
    mine = own_addresses(f)
    where = f"node 0 ({host}: {', '.join(mine) or 'no address found'})"
    if m.get("error"):
        seen = f"does not resolve on node 0 ({m['error']})"
    else:
        seen = "" if m.get("addrs") == [addr] else f" (it resolves to {', '.join(m['addrs'])} there)"
        seen = f"is not an address of {where}{seen}"
        where = ""
    if ctx.job.cluster.master_addr:
        return CheckResult(CHECK, 0, host, "fail", f"cluster.master_addr: {addr} {seen}" +
                           (f"; the addresses of {where}" if where else ""),
                           f"set it to one of them, or leave it out (mlaunch then uses hosts[0], "
                           f"{host}, which must resolve to node 0 on every node)")
    return CheckResult(CHECK, 0, host, "fail",
                       f"hosts[0] {host} (the master address while cluster.master_addr is unset) {seen}"
                       + (f"; the addresses of {where}" if where else ""),
                       "set cluster.master_addr to one of them (the one the other nodes reach), "
                       f"or fix what {host} resolves to on node 0 (/etc/hosts, DNS)")


def own_addresses(f: dict) -> list[str]:
    """Node 0's addresses from its interface list: loopback first, then the others."""
    ifaces = f.get("host", {}).get("ifaces") or {}
    names = sorted(ifaces, key=lambda n: (n != "lo", n))
    return [a for n in names if ifaces[n].get("up") for a in ifaces[n].get("addrs", [])][:8]

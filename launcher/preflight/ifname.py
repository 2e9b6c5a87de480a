"""NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME: do the interfaces they name exist on each node?

The two variables have different grammars. NCCL takes a comma list of name *prefixes*
("eth" matches eth0, eth1), "^" in front excludes the listed ones instead, "=" in front
asks for exact names (NCCL reads "^" first, then "="), and an entry may carry ":port".
gloo (torch) takes a comma list of exact interface names.
"""
from __future__ import annotations

from .probe import Ctx
from .report import CheckResult

VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def nccl_selected(spec: str, names: list[str]) -> list[str]:
    """The interfaces, out of names, that NCCL_SOCKET_IFNAME=spec lets NCCL use."""
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    patterns = [p.split(":")[0].strip() for p in spec.split(",") if p.split(":")[0].strip()]

    def hit(name: str) -> bool:
        return any(name == p if exact else name.startswith(p) for p in patterns)
    return [n for n in names if hit(n) != exclude]


def gloo_selected(spec: str, names: list[str]) -> tuple[list[str], list[str]]:
    """(listed names that exist, listed names that do not) for GLOO_SOCKET_IFNAME=spec."""
    wanted = [n.strip() for n in spec.split(",") if n.strip()]
    return [n for n in wanted if n in names], [n for n in wanted if n not in names]


def usable(ifaces: dict) -> list[str]:
    """Interfaces that are up and have an address: the only ones a socket can use."""
    return [n for n, i in ifaces.items() if i.get("up") and i.get("addrs")]


def problem(var: str, spec: str, ifaces: dict) -> str | None:
    """Why var=spec leaves this node without a usable interface, or None when it is fine."""
    up = usable(ifaces)
    if var == "GLOO_SOCKET_IFNAME":
        _, missing = gloo_selected(spec, list(ifaces))
        down = [n for n in gloo_selected(spec, list(ifaces))[0] if n not in up]
        if missing:
            return f"{var}={spec}: no interface {', '.join(missing)} here"
        if down:
            return f"{var}={spec}: {', '.join(down)} is down or has no address"
        return None
    chosen = nccl_selected(spec, up)
    if not chosen:
        return f"{var}={spec} matches no usable interface here"
    if all(n == "lo" for n in chosen):
        return f"{var}={spec} leaves only lo: traffic to other nodes would go to loopback"
    return None


def check(ctx: Ctx, facts: dict) -> list[CheckResult]:
    """One row per node over both variables; skipped when neither is set."""
    env = dict(ctx.nodes[0].env)
    given = [(v, env[v]) for v in VARS if v in env]
    good = _common_interfaces(ctx, facts)
    out = []
    for r in ctx.live:
        host, f = ctx.nodes[r].host, facts.get(r)
        if not given:
            out.append(CheckResult("network/ifname", r, host, "skip", "NCCL/GLOO_SOCKET_IFNAME not set"))
            continue
        ifaces = f.get("host", {}).get("ifaces") if isinstance(f, dict) else None
        if ifaces is None:
            out.append(CheckResult("network/ifname", r, host, "skip", "no interface list from this node"))
            continue
        bad = [(v, p) for v, s in given if (p := problem(v, s, ifaces))]
        if not bad:
            out.append(CheckResult("network/ifname", r, host, "pass",
                                   "; ".join(f"{v}={s}" for v, s in given)))
            continue
        var = bad[0][0]
        hint = f"one of: {', '.join(good)}" if good else "an interface that exists on every node (ip -br addr)"
        out.append(CheckResult("network/ifname", r, host, "fail", "; ".join(p for _, p in bad),
                               f"set cluster.env.{var} to {hint}"))
    return out


def _common_interfaces(ctx: Ctx, facts: dict) -> list[str]:
    """Non-loopback interfaces usable on every node that answered: the safe choices."""
    sets = [set(usable(f["host"]["ifaces"])) - {"lo"} for r in ctx.live
            if isinstance(f := facts.get(r), dict) and "ifaces" in f.get("host", {})]
    return sorted(set.intersection(*sets)) if sets else []

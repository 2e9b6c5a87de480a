"""`storage/staged` (issue 54): per node, whether each staged item is there and current (its
manifest matches the source's), what submit would copy, and what would stop it (a disk too
small, no rsync). `mlaunch check` only: submit stages before its preflight."""
from __future__ import annotations

from ..plan.staging import size_text
from .probe import Ctx
from .report import CheckResult

CHECK = "storage/staged"
WORDS = {"current": "current", "absent": "absent", "changed": "changed on the node",
         "other": "another content than the source", "no-source": "no node holds the source"}


def check(ctx: Ctx) -> list[CheckResult]:
    """One row per reachable node; none when the spec stages nothing."""
    if not ctx.job.staging or not ctx.live:
        return []
    from ..transport.staging import node_states
    found = node_states(ctx.plan, ctx.executor, ctx.live)
    return [_row(ctx, r, found[r]) for r in ctx.live]


def _row(ctx: Ctx, r: int, rows) -> CheckResult:
    host = ctx.nodes[r].host
    if isinstance(rows, str):
        return CheckResult(CHECK, r, host, "fail", f"probe failed: {rows}", f"check python3 on {host}")
    blocked = [(w, s, n) for w, s, n in rows if s in ("no-room", "no-rsync")]
    if blocked:
        w, s, n = blocked[0]
        fix = (f"install rsync on {host}" if s == "no-rsync" else f"free {size_text(n)} on {host}, or stage elsewhere")
        return CheckResult(CHECK, r, host, "fail", f"{w}: " + ("rsync missing" if s == "no-rsync" else
                                                              f"lacks {size_text(n)}, more than the free space"), fix)
    text = "; ".join(f"{w}: {WORDS.get(s, s)}" + (f" (submit copies {size_text(n)})" if s != "current" else "")
                     for w, s, n in rows)
    return CheckResult(CHECK, r, host, "pass", text)

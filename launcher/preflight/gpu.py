"""GPU checks from nvidia-smi's CSV: enough GPUs, one driver version everywhere, nobody else on them."""
from __future__ import annotations

from collections import Counter

from ..spec.rules import node_devices
from ..spec.select import procs_of
from .probe import Ctx
from .report import CheckResult

BUSY_MIB = 1024  # more used memory than a context takes, with no process listed: someone else's job


def parse_gpus(text: str) -> list[dict]:
    """Rows of `--query-gpu=index,uuid,driver_version,memory.used,memory.total` (noheader, nounits)."""
    out = []
    for line in text.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) == 5 and f[0].isdigit():
            out.append({"index": int(f[0]), "uuid": f[1], "driver": f[2],
                        "used": _num(f[3]), "total": _num(f[4])})
    return out


def parse_apps(text: str) -> list[dict]:
    """Rows of `--query-compute-apps=gpu_uuid,pid,process_name,used_memory` (noheader, nounits)."""
    out = []
    for line in text.splitlines():
        raw = line.split(",")
        f = [x.strip() for x in raw]
        if len(f) >= 4 and f[1].isdigit():
            # process names may contain commas: everything between pid and memory is the name
            out.append({"uuid": f[0], "pid": int(f[1]), "name": ",".join(raw[2:-1]).strip(),
                        "used": _num(f[-1])})
    return out


def _num(text: str) -> float:
    """nvidia-smi's number, 0 for [N/A]."""
    try:
        return float(text)
    except ValueError:
        return 0.0   # "[N/A]" on some boards


def wanted(ctx: Ctx, rank: int) -> list[int]:
    """GPU indices the job's ranks will use on node `rank`."""
    c = ctx.job.cluster
    mine = node_devices(c, rank)
    return mine if mine is not None else list(range(procs_of(c, rank)))


def memory_facts(ctx: Ctx, facts: dict) -> dict:
    """For batch planning: the smallest memory.total (MiB) of the GPUs the job uses, and the
    model's config.json as node 0 read it (None where unknown)."""
    totals = []
    for r in ctx.live:
        f = facts.get(r)
        g = f.get("gpu", {}) if isinstance(f, dict) else {}
        if g.get("smi") and g.get("code") == 0:
            use = set(wanted(ctx, r))
            totals += [x["total"] for x in parse_gpus(g.get("gpus", "")) if x["index"] in use and x["total"]]
    node0 = facts.get(0) if isinstance(facts.get(0), dict) else {}
    cfg = (node0.get("model_config") or {}).get("config")
    return {"gpu_mib": min(totals) if totals else None, "model_config": cfg if isinstance(cfg, dict) else None}


def check(ctx: Ctx, facts: dict, busy: bool = True) -> list[CheckResult]:
    """Per node: nvidia-smi works, the GPUs exist, the driver matches the majority, GPUs are
    idle (busy False: not judged, for a restart's host check, hostcheck.py)."""
    gpus = {r: parse_gpus(f["gpu"].get("gpus", "")) for r in ctx.live
            if isinstance(f := facts.get(r), dict) and f.get("gpu", {}).get("smi")}
    drivers = {r: g[0]["driver"] for r, g in gpus.items() if g}
    ref = _majority(drivers)
    out = []
    for r in ctx.live:
        host, f = ctx.nodes[r].host, facts.get(r)
        if not isinstance(f, dict) or "gpu" not in f:
            out.append(CheckResult("gpu", r, host, "skip", "no facts from this node (see software/python)"))
            continue
        g = f["gpu"]
        if not g.get("smi"):
            why = g.get("error") or "no nvidia-smi (CPU-only node?)"
            out.append(CheckResult("gpu", r, host, "skip", why))
            continue
        problem = _problem(ctx, r, host, g, gpus.get(r, []), ref, busy)
        status, detail, fix = ("fail", *problem) if problem else ("pass", _summary(gpus[r]), None)
        out.append(CheckResult("gpu", r, host, status, detail, fix))
    return out


def _problem(ctx: Ctx, rank: int, host: str, g: dict, rows: list[dict], ref,
             busy: bool = True) -> tuple[str, str] | None:
    """(detail, fix) of the first thing wrong with this node's GPUs, or None."""
    if g.get("code") != 0 or not rows:
        first = (g.get("gpus") or "").strip().splitlines()[:1]
        return (f"nvidia-smi failed: {first[0] if first else 'no output'}",
                f"fix the NVIDIA driver on {host} (nvidia-smi; dmesg | grep -i nvrm), "
                "then reboot if it was updated")
    have = {x["index"] for x in rows}
    use = wanted(ctx, rank)
    missing = [i for i in use if i not in have]
    if missing:
        fix = (f"run at most {len(rows)} processes on {host} (cluster.gpus_per_node or its "
               "hostfile slots=), or set cluster.cuda_visible_devices to GPUs that exist")
        if node_devices(ctx.job.cluster, rank) is not None:
            fix = (f"list GPUs that exist on {host} (0-{len(rows) - 1}) in "
                   "cluster.cuda_visible_devices")
        return (f"sees {len(rows)} GPU(s), the job uses {len(use)} "
                f"(missing index {', '.join(map(str, missing))})", fix)
    if ref and rows[0]["driver"] != ref[1]:
        return (f"driver {rows[0]['driver']} here, {ref[1]} on node{ref[0]}",
                f"install NVIDIA driver {ref[1]} on {host} (as on node{ref[0]}), then reboot")
    return _busy(ctx, rank, host, g, rows) if busy else None


def _busy(ctx: Ctx, rank: int, host: str, g: dict, rows: list[dict]) -> tuple[str, str] | None:
    """(detail, fix) when another process holds memory on a GPU the job uses, or None."""
    by_uuid = {x["uuid"]: x["index"] for x in rows}
    use = set(wanted(ctx, rank))
    apps = [a for a in parse_apps(g.get("apps", "")) if by_uuid.get(a["uuid"]) in use]
    if apps:
        a = apps[0]
        listed = "; ".join(f"GPU {by_uuid[x['uuid']]}: {x['used']:.0f} MiB by pid {x['pid']} ({x['name']})"
                           for x in apps)
        return (f"in use: {listed}",
                f"stop pid {a['pid']} on {host} (kill {a['pid']}), or pick idle GPUs with "
                "cluster.cuda_visible_devices")
    hidden = [x for x in rows if x["index"] in use and x["used"] > BUSY_MIB]
    if hidden:
        x = hidden[0]
        return (f"GPU {x['index']}: {x['used']:.0f} MiB in use by a process not visible here "
                "(another container?)",
                f"free GPU {x['index']} on {host} (run nvidia-smi on the host itself), or pick idle GPUs "
                "with cluster.cuda_visible_devices")
    return None


def _summary(rows: list[dict]) -> str:
    """The ✓ detail."""
    return f"{len(rows)} GPU(s), driver {rows[0]['driver']}, idle"


def _majority(values: dict[int, str]) -> tuple[int, str] | None:
    """(rank, value) most nodes have; ties go to the lowest rank."""
    if not values:
        return None
    best, n = Counter(values.values()).most_common(1)[0]
    ties = {v for v, c in Counter(values.values()).items() if c == n}
    r = min(r for r, v in values.items() if v in ties)
    return r, values[r]

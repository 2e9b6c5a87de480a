"""Storage checks: output space, shared_dir really shared, inputs present; and /dev/shm's size."""
from __future__ import annotations

from collections import defaultdict

from .probe import Ctx
from .report import CheckResult


def check_output(ctx: Ctx, facts: dict) -> list[CheckResult]:
    """Per node: the output directory (or its nearest parent) is writable with enough free space."""
    return _per_node(ctx, facts, "storage/output", "out", _output_row)


def _output_row(ctx: Ctx, r: int, host: str, f: dict, o: dict) -> CheckResult:
    need = ctx.pf.min_free_gb
    if f.get("workdir_error"):
        return CheckResult("storage/output", r, host, "fail", f"workdir {f['workdir_error']}",
                           f"create cluster.workdir on {host}: mkdir -p {ctx.job.cluster.workdir}")
    if "error" in o and "base" not in o:
        return CheckResult("storage/output", r, host, "fail", o["error"],
                           f"check the filesystem under the output directory on {host}")
    if not o.get("writable"):
        user = f.get("python", {}).get("user", "the ssh user")
        return CheckResult("storage/output", r, host, "fail",
                           f"{o['base']} is not writable by {user}: {o.get('error')}",
                           f"on {host}: mkdir -p {o['path']} && chown {user} {o['path']}")
    if o["free_gb"] < need:
        return CheckResult("storage/output", r, host, "fail",
                           f"{o['free_gb']:.1f} GB free under {o['base']}, need {need:g} GB",
                           f"free space on {host}:{o['base']}, point output_dir at a larger disk, "
                           "or lower preflight.min_free_gb")
    return CheckResult("storage/output", r, host, "pass", f"{o['path']} writable, {o['free_gb']:.0f} GB free")


def check_shared(ctx: Ctx, facts: dict, mesh: dict) -> list[CheckResult]:
    """Per node: a file each node wrote in shared_dir is visible from every other node."""
    d = ctx.job.cluster.shared_dir
    if not d:
        return [CheckResult("storage/shared", r, ctx.nodes[r].host, "skip", "cluster.shared_dir not set")
                for r in ctx.live]
    wrote = {r: f["shared"] for r in ctx.live if isinstance(f := facts.get(r), dict) and "shared" in f}
    seen = {r: {int(k) for k, v in m["shared"].items() if v == "ok"}
            for r in ctx.live if isinstance(m := mesh.get(r), dict) and "shared" in m}
    group = main_group(seen)
    out = []
    for r in ctx.live:
        host = ctx.nodes[r].host
        w = wrote.get(r)
        if w is None or r not in seen:
            out.append(_skip("storage/shared", ctx, r, facts.get(r) if w is None else mesh.get(r)))
        elif not w.get("ok"):
            out.append(CheckResult("storage/shared", r, host, "fail", f"cannot write in {d}: {w.get('error')}",
                                   f"mount the shared filesystem at {d} on {host}, writable by the ssh user"))
        elif r not in group:
            others = sorted(group)
            out.append(CheckResult(
                "storage/shared", r, host, "fail",
                f"{d} here is not the storage node{', node'.join(map(str, others))} see "
                f"(sees files of: {_ranks(seen[r])}; "
                f"its file seen by: {_ranks({j for j in seen if r in seen[j]})})",
                f"mount the shared filesystem at {d} on {host} as on node{others[0]} "
                f"(compare `findmnt -T {d}` on both)" if others else f"mount the shared filesystem at {d}"))
        else:
            out.append(CheckResult("storage/shared", r, host, "pass", f"{d}: every node sees the others' files"))
    return out


def main_group(seen: dict[int, set[int]]) -> set[int]:
    """Nodes that share one storage: the largest set that all see exactly the same files
    (ties: the set holding the lowest rank, since node 0's copy is the one staged)."""
    groups: dict[frozenset, set[int]] = defaultdict(set)
    for r, s in seen.items():
        groups[frozenset(s)].add(r)
    if not groups:
        return set()
    return max(groups.values(), key=lambda g: (len(g), -min(g)))


def _ranks(rs: set[int]) -> str:
    """node0, node2 ... or none."""
    return ", ".join(f"node{r}" for r in sorted(rs)) or "none"


def check_inputs(ctx: Ctx, facts: dict) -> list[CheckResult]:
    """Per node: model, dataset_dir/dataset_info.json (and its files), or the script, exist."""
    items = {r: f.get("inputs") for r in ctx.live if isinstance(f := facts.get(r), dict)
             and isinstance(f.get("inputs"), list)}
    out = []
    for r in ctx.live:
        host = ctx.nodes[r].host
        if r not in items:
            out.append(_unchecked_inputs(ctx, r, facts.get(r)))
            continue
        bad = [(k, i) for k, i in enumerate(items[r]) if not i.get("ok")]
        if not bad:
            notes = [i["note"] for i in items[r] if i.get("note")]
            text = ", ".join(f"{i['what']} {i['path']}" for i in items[r]) or "nothing to check"
            out.append(CheckResult("storage/inputs", r, host, "pass", "; ".join([text] + notes)))
            continue
        k, first = bad[0]
        # Where another node has this input, it is missing here; where none has it, a
        # close name beside it is most likely what the spec meant.
        has = [j for j, its in items.items() if j != r and k < len(its) and its[k].get("ok")]
        out.append(CheckResult("storage/inputs", r, host, "fail",
                               "; ".join(f"{i['what']}: {i.get('error')}" for _, i in bad),
                               _input_fix(ctx, host, first, has)))
    return out


# The spec key that names each kind of input, for "fix the name there".
FIELD = {"dataset": "dataset", "script": "script.path", "model": "model"}


def _input_fix(ctx: Ctx, host: str, item: dict, has: list[int]) -> str:
    """How to get a missing input onto the node, or which name the spec likely meant."""
    if not has and item.get("unknown"):
        return _name_fix(item)
    if not has and item.get("close"):
        key = "dataset_dir" if item["kind"] == "dataset" else FIELD.get(item["what"], item["what"])
        return f"did you mean {_alternatives(item['close'])}? (fix `{key}` in the spec)"
    where = f"or keep it under cluster.shared_dir ({ctx.job.cluster.shared_dir})" if ctx.job.cluster.shared_dir \
        else "or put it on storage every node mounts"
    if item["kind"] == "dataset":
        return (f"copy the dataset directory {item['path']} (with dataset_info.json and its files) "
                f"to {host}, {where}")
    if item["what"] == "module":
        return f"install the package providing {item['path']} into the job's environment on {host}"
    return f"copy {item['path']} to {host} at the same path, {where}"


def _name_fix(item: dict) -> str:
    """Dataset names that dataset_info.json lists on no node: the close ones, or what it lists."""
    parts = [_one_name(item, u) for u in item["unknown"]]
    if len(parts) == 1:
        return parts[0]
    return "; ".join(f"{u['name']!r}: {p}" for u, p in zip(item["unknown"], parts))


def _one_name(item: dict, u: dict) -> str:
    """The fix for one unknown name."""
    if u["close"]:
        return f"did you mean {_alternatives(u['close'])}? (fix `dataset` in the spec)"
    more = item["n_listed"] - len(item["listed"])
    listed = ", ".join(item["listed"]) + (f", … ({item['n_listed']} in all)" if more > 0 else "")
    return (f"{item['info']} lists {listed or 'no dataset'}: set `dataset` to one of those, "
            f"or add an entry for {u['name']!r} to it")


def _alternatives(names: list[str]) -> str:
    """'a' or 'b' or 'c'."""
    return " or ".join(repr(n) for n in names)


def check_shm(ctx: Ctx, facts: dict) -> list[CheckResult]:
    """Per node: /dev/shm holds at least min_shm_mb (Docker's 64 MB default gives Bus errors)."""
    return _per_node(ctx, facts, "container/shm", "shm", _shm_row)


def _shm_row(ctx: Ctx, r: int, host: str, f: dict, s: dict) -> CheckResult:
    need = ctx.pf.min_shm_mb
    gb = max(1, -(-need // 1024) * 2)  # advise twice the minimum, in whole GB
    if "error" in s:
        return CheckResult("container/shm", r, host, "fail", f"/dev/shm: {s['error']}",
                           f"docker run --shm-size={gb}g (or mount a tmpfs at /dev/shm on {host})")
    if s["mb"] < need:
        return CheckResult("container/shm", r, host, "fail", f"/dev/shm is {_mb(s['mb'])}, need {need} MB",
                           f"docker run --shm-size={gb}g (Kubernetes: an emptyDir with medium: Memory at "
                           f"/dev/shm; bare metal: mount -o remount,size={gb}g /dev/shm)")
    return CheckResult("container/shm", r, host, "pass", f"/dev/shm {_mb(s['mb'])}")


def _per_node(ctx: Ctx, facts: dict, check: str, key: str, row) -> list[CheckResult]:
    """One row per live node: row(ctx, rank, host, its facts, its `key` fact), or a skip row
    where the node sent no such fact."""
    out = []
    for r in ctx.live:
        f = facts.get(r)
        fact = f.get(key) if isinstance(f, dict) else None
        out.append(row(ctx, r, ctx.nodes[r].host, f, fact) if fact else _skip(check, ctx, r, f))
    return out


def _mb(mb: float) -> str:
    """A size in MB, human-readable."""
    return f"{mb / 1024:.1f} GB" if mb >= 1024 else f"{mb:.0f} MB" if mb >= 1 else f"{mb * 1024:.0f} KB"


def _unchecked_inputs(ctx: Ctx, r: int, node_facts) -> CheckResult:
    """A node that answered but whose input check crashed or hung fails: a job started on
    unverified inputs is what the check exists to prevent (a node that did not answer at
    all is another row's failure, and skips here)."""
    err = node_facts.get("inputs") if isinstance(node_facts, dict) else None
    if not (isinstance(err, dict) and err.get("error")):
        return _skip("storage/inputs", ctx, r, node_facts)
    host = ctx.nodes[r].host
    return CheckResult("storage/inputs", r, host, "fail", f"the input check did not finish: {err['error']}",
                       f"check the model, dataset and script paths on {host} by hand (`ls` them); "
                       "a hung network mount makes this check time out")


def _skip(check: str, ctx: Ctx, r: int, why) -> CheckResult:
    """A – row carrying why the node has no data for the check."""
    if isinstance(why, dict) and why.get("error"):
        why = why["error"]
    text = why if isinstance(why, str) else "no facts from this node (see software/python)"
    return CheckResult(check, r, ctx.nodes[r].host, "skip", text)

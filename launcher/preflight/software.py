"""Software checks: the interpreter, torch and torchrun exist, and every node runs the same stack.

Mixed torch / CUDA / NCCL versions between nodes fail late and obscurely (hangs in the
first collective, "unhandled system error"); comparing them up front costs nothing.
"""
from __future__ import annotations

import re
from collections import Counter

from ..plan.launch_plan import remote_bin
from .probe import Ctx
from .report import CheckResult

FIELDS = ("torch", "cuda", "nccl", "trainer", "transformers")


def stack(f: dict) -> dict[str, str] | None:
    """The versions that must match across nodes, or None when torch is not there."""
    t = f.get("torch", {})
    if not t.get("version"):
        return None
    tr = f.get("trainer", {})
    out = {"torch": t["version"], "cuda": t.get("cuda") or "none", "nccl": t.get("nccl") or "none"}
    if tr.get("name"):
        out["trainer"] = f"{tr['name']} {tr.get('version') or 'missing'}"
    if tr.get("transformers"):
        out["transformers"] = tr["transformers"]
    return out


def node_stacks(ctx: Ctx, facts: dict) -> dict[int, dict[str, str]]:
    """The version stack of every reachable node that reported torch."""
    return {r: s for r in ctx.live if isinstance(facts.get(r), dict) and (s := stack(facts[r]))}


def majority_stack(ctx: Ctx, facts: dict) -> dict[str, str]:
    """The versions most nodes run (what the plan renders for); {} when none reported."""
    ref = reference(node_stacks(ctx, facts))
    return dict(ref[1]) if ref else {}


def reference(values: dict[int, dict]) -> tuple[int, dict] | None:
    """The majority stack (ties: the lowest rank's): what the odd nodes should match."""
    if not values:
        return None
    counts = Counter(tuple(sorted(v.items())) for v in values.values())
    best = max(counts.values())
    for r in sorted(values):
        if counts[tuple(sorted(values[r].items()))] == best:
            return r, values[r]
    return None


def pip_spec(name: str, version: str) -> str:
    """`name==public` plus the PyTorch index for local builds (+cpu, +cu121, +rocm6.1)."""
    public, _, local = version.partition("+")
    pytorch_index = re.match(r"^(cpu|cu\d+|rocm[\d.]+)$", local)
    index = f" --index-url https://download.pytorch.org/whl/{local}" if pytorch_index else ""
    return f"'{name}=={public}'{index}"


def check_python(ctx: Ctx, facts: dict) -> list[CheckResult]:
    """Per node: the job's interpreter runs, torch is installed, torchrun is where mlaunch runs it."""
    ref = reference(node_stacks(ctx, facts))
    out = []
    for r in ctx.live:
        host, f = ctx.nodes[r].host, facts.get(r)
        problem = _python_problem(ctx, f, ref)
        if problem:
            out.append(CheckResult("software/python", r, host, "fail", problem[0], problem[1]))
        else:
            p = f["python"]
            out.append(CheckResult("software/python", r, host, "pass",
                                   f"python {p['version']} at {p['exe']}, torch, torchrun"))
    return out


def _python_problem(ctx: Ctx, f, ref) -> tuple[str, str] | None:
    """(detail, fix) of the first missing piece of the node's stack, or None."""
    py = ctx.python
    if isinstance(f, str):
        fix = getattr(f, "fix", None)   # probe.ContainerProblem: the runtime or the image
        return f, fix or f"run `{py} -c 'import torch'` on the node and fix what it reports"
    image = ctx.job.cluster.container.image if ctx.job.cluster.container else None
    if image:
        inside = _in_image(ctx, f, ref)
        if inside:
            return inside
    if f.get("nopython"):
        return (f"no {py} and no python3 on PATH",
                "install the training environment there, or point cluster.python / cluster.venv at it")
    if f["python"].get("missing"):
        return (f"no interpreter at {py}",
                "create the environment at that path (as on the other nodes), "
                "or fix cluster.python / cluster.venv")
    torch_v = ref[1]["torch"] if ref else None
    if f.get("torch", {}).get("error"):
        spec = pip_spec("torch", torch_v) if torch_v else "torch"
        return f"torch: {f['torch']['error']}", f"{py} -m pip install {spec}"
    tr = f.get("trainer", {})
    if tr.get("error"):
        want = ref[1].get("trainer", "").split(" ")[-1] if ref else ""
        spec = f"'{tr['name']}=={want}'" if want and want != "missing" else tr["name"]
        return tr["error"], f"{py} -m pip install {spec}"
    if tr.get("tracker_missing"):
        pkg = tr["tracker_missing"]
        return (f"report_to {ctx.job.report_to}: {pkg} is not installed (the run would stop at start)",
                f"{py} -m pip install {pkg}, or set report_to: none")
    if tr.get("features_missing"):
        opts = ", ".join(f"{o}: true needs {p}" for o, p in tr["features_missing"])
        pips = " ".join(p for _, p in tr["features_missing"])
        return (f"passthrough {opts}, not installed (LLaMA-Factory would stop at start on every rank)",
                f"{py} -m pip install {pips}, or turn the option off")
    return _torchrun_problem(ctx, f.get("torchrun", {}), torch_v)


def _in_image(ctx: Ctx, f: dict, ref) -> tuple[str, str] | None:
    """(detail, fix) of what the image lacks (cluster.container): its interpreter, torch, the
    trainer; the fix is the image's, never a pip install on the node."""
    image, py = ctx.job.cluster.container.image, ctx.python
    fix = f"install it in the image {image}, or set cluster.container.image to one that has it"
    if f.get("nopython"):
        return f"image {image}: no {py} and no python3 in it", "set cluster.python to the image's interpreter"
    if f["python"].get("missing"):
        return f"image {image}: no interpreter at {py}", "set cluster.python to the image's interpreter"
    if f.get("torch", {}).get("error"):
        return f"image {image}: torch: {f['torch']['error']}", fix
    tr = f.get("trainer", {})
    if tr.get("error"):
        return f"image {image}: {tr['error']}", fix
    return None


def _torchrun_problem(ctx: Ctx, t: dict, torch_v: str | None) -> tuple[str, str] | None:
    """(detail, fix) when torchrun is not where mlaunch will run it, or None."""
    if t.get("error"):
        return f"torchrun: {t['error']}", "check the environment's bin/ directory"
    if t.get("module"):   # `python -m torch.distributed.run`: torch itself, checked above
        return None
    if t.get("wanted"):
        if t.get("ok"):
            return None
        also = f" (there is one at {t['on_path']}, but mlaunch runs {t['wanted']})" if t.get("on_path") else ""
        spec = pip_spec("torch", torch_v) if torch_v else "torch"
        return (f"no torchrun next to {ctx.python}{also}",
                f"reinstall torch into that environment (it installs torchrun): "
                f"{ctx.python} -m pip install --force-reinstall {spec}")
    if t.get("on_path"):
        return None
    return ("torchrun is not on PATH",
            "set cluster.python (or cluster.venv) to the interpreter whose bin/ holds torchrun")


def check_versions(ctx: Ctx, facts: dict) -> list[CheckResult]:
    """Per node: torch, CUDA, NCCL and trainer versions equal the majority's."""
    stacks = node_stacks(ctx, facts)
    ref = reference(stacks)
    out = []
    for r in ctx.live:
        host = ctx.nodes[r].host
        if r not in stacks:
            out.append(CheckResult("software/versions", r, host, "skip", "no torch here (see software/python)"))
            continue
        mine, (ref_rank, want) = stacks[r], ref
        diff = [k for k in FIELDS if mine.get(k) != want.get(k)]
        if not diff:
            out.append(CheckResult("software/versions", r, host, "pass",
                                   ", ".join(f"{k} {mine[k]}" if k != "trainer" else mine[k]
                                             for k in FIELDS if k in mine)))
            continue
        detail = "; ".join(f"{k} {mine.get(k)} here, {want.get(k)} on node{ref_rank}" for k in diff)
        out.append(CheckResult("software/versions", r, host, "fail", detail,
                               _version_fix(ctx, diff, want, ref_rank)))
    return out


STALE_LOCK_S = 300   # a JIT build of one op takes a minute or two; older locks are orphans


def check_ext_locks(ctx: Ctx, facts: dict) -> list[CheckResult]:
    """Per node: no torch extension build lock left by a killed build (ranks would hang)."""
    out = []
    for r in ctx.live:
        host, f = ctx.nodes[r].host, facts.get(r)
        e = f.get("ext_locks") if isinstance(f, dict) else None
        if not isinstance(e, dict) or "locks" not in e:
            out.append(CheckResult("software/jit-lock", r, host, "skip", "no facts from this node"))
            continue
        stale = [(p, age) for p, age in e["locks"] if age > STALE_LOCK_S]
        if stale:
            path, age = max(stale, key=lambda x: x[1])
            out.append(CheckResult(
                "software/jit-lock", r, host, "fail",
                f"{path} is {age // 60} min old: a killed JIT build (DeepSpeed op) left it, and "
                "every rank that loads the op would wait on it forever",
                f"rm {' '.join(p for p, _ in stale)}  (on {host}, if no build runs there: pgrep -f ninja)"))
        else:
            busy = f"; a build is running ({len(e['locks'])} fresh lock)" if e["locks"] else ""
            out.append(CheckResult("software/jit-lock", r, host, "pass", f"no stale lock in {e['root']}{busy}"))
    return out


def check_pyspy(ctx: Ctx, facts: dict) -> list[CheckResult]:
    """Per node: can the hang watchdog dump the ranks' stacks? A miss never blocks a launch
    (a hang is still torn down), so it is a skip that says what is lost and the fix."""
    h = ctx.plan.job.health
    if not (h.enabled and h.stack_dumps):
        return []
    out = []
    for r in ctx.live:
        host, f = ctx.nodes[r].host, facts.get(r)
        p = f.get("pyspy") if isinstance(f, dict) else None
        if not isinstance(p, dict) or "path" not in p:
            continue
        if not p["path"]:
            where = remote_bin(ctx.plan.job) or "the node's environment"
            out.append(CheckResult("software/py-spy", r, host, "skip",
                                   f"py-spy not found: a hang is torn down without stack dumps; "
                                   f"pip install py-spy into {where}"))
        elif not p["root"] and (p["ptrace_scope"] or 0) >= 1:
            out.append(CheckResult("software/py-spy", r, host, "skip",
                                   f"{p['path']}, but kernel.yama.ptrace_scope={p['ptrace_scope']} "
                                   "refuses ptrace of the ranks: sysctl kernel.yama.ptrace_scope=0, "
                                   "or give py-spy CAP_SYS_PTRACE"))
        else:
            out.append(CheckResult("software/py-spy", r, host, "pass", p["path"]))
    return out


def _version_fix(ctx: Ctx, diff: list[str], want: dict, ref_rank: int) -> str:
    """The pip command that brings a node to the reference stack."""
    py = ctx.python
    if "torch" in diff or "cuda" in diff:
        return f"{py} -m pip install {pip_spec('torch', want['torch'])}  (to match node{ref_rank})"
    if "trainer" in diff:
        name, _, version = want["trainer"].partition(" ")
        return f"{py} -m pip install '{name}=={version}'  (to match node{ref_rank})"
    if "transformers" in diff and want.get("transformers"):
        return f"{py} -m pip install 'transformers=={want['transformers']}'  (to match node{ref_rank})"
    if "transformers" in diff:
        return f"{py} -m pip uninstall transformers  (node{ref_rank} has none)"
    return (f"install NCCL {want['nccl']} as on node{ref_rank} "
            f"(for pip wheels: {py} -m pip install 'nvidia-nccl-cu12=={want['nccl']}')")

"""The end-to-end proof: an all-reduce across every node and local rank, through mlaunch's
own fan-out (same SSH, same torchrun, same env, same master port) with a hard timeout."""
from __future__ import annotations

import io
import posixpath
import re
import shutil
import tempfile

from .. import nodeprog, render
from ..session.attempt import JobResult, run_job
from ..logs.stream import Printer
from ..plan.launch_plan import LaunchPlan, build_plan, new_run_id, uses_default_base
from ..spec import validate
from . import transport
from .probe import Ctx, on_nodes, sh_script
from .report import CheckResult

RESULT = re.compile(r"MLAUNCH-COLLECTIVE (\{.*\})")
PROGRESS = re.compile(r"^\[node(\d+) [^\]]*\] mlaunch-collective: rank \d+/\d+ (starting|joined)", re.M)
BACKEND = re.compile(r"^\[node(\d+) [^\]]*\] mlaunch-collective: rank \d+/\d+ starting \((\w+)\)", re.M)
# Only for the check: NCCL says which network, devices and channels it chose (see transport.py).
NCCL_INFO = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}


def collective_plan(ctx: Ctx, run_id: str, log_dir: str) -> LaunchPlan:
    """A `trainer: script` job over the user's own cluster block that runs the all-reduce."""
    cluster = ctx.job.cluster.model_dump(mode="json", exclude_unset=True, by_alias=True)
    cluster["hosts"] = list(ctx.job.cluster.hosts or [])
    cluster.pop("hostfile", None)
    scheduler = cluster.pop("scheduler", "ssh")
    if scheduler != "ssh":   # a scheduler's allocation: its nodes, reached by the check's transport
        cluster.pop(scheduler, None)
        cluster["hosts"] = [n.host for n in ctx.nodes]
        if getattr(ctx.executor, "master_addr", None):   # placed by the transport (Ray)
            cluster["master_addr"] = ctx.master_addr
    env = {k: v for k, v in cluster.get("env", {}).items() if k != "NCCL_DEBUG_FILE"}
    cluster["env"] = {**env, **NCCL_INFO}   # the lines must reach stdout, not a file
    pf = ctx.pf
    spec = {"name": "preflight", "trainer": "script", "cluster": cluster,
            "script": {"path": "collective.py",
                       "args": ["--mb", str(pf.collective_mb), "--timeout", f"{pf.collective_timeout_s:g}"]}}
    run_dir = build_plan(validate(spec, secret_env=ctx.job._secret_env), run_id=run_id, log_dir=log_dir).run_dir
    spec["script"]["path"] = posixpath.join(run_dir, "collective.py")
    return build_plan(validate(spec, secret_env=ctx.job._secret_env), run_id=run_id, log_dir=log_dir)


def stage(ctx: Ctx, plan: LaunchPlan) -> str | None:
    """Write the program on every node itself, not only on node 0 (shared_dir may be exactly
    what is broken); None when every node has it, else why not."""
    path = plan.job.script.path
    text = nodeprog.source("collective")
    dirs = render.private_dirs_script(plan.run_dir, uses_default_base(plan.job))
    outs = on_nodes(ctx, lambda r: sh_script("stage", path=path, content=text, private_dirs=dirs),
                    ctx.pf.check_timeout_s)
    bad = [f"node{r}: {o.why()}" for r, o in sorted(outs.items()) if o.code != 0]
    return "; ".join(bad) or None


def run(ctx: Ctx) -> list[CheckResult]:
    """Run the all-reduce: its row (✓ with the bus bandwidth, or ✗ with how far it got and
    why) and, when the nodes said which network they used, the transport row."""
    log_dir = tempfile.mkdtemp(prefix="mlaunch-preflight-")
    out, plan = io.StringIO(), None
    try:
        plan = collective_plan(ctx, new_run_id("preflight"), log_dir)
        problem = stage(ctx, plan)
        if problem:
            return [_fail(f"could not write the test program: {problem}",
                         f"make {plan.run_dir} creatable by the ssh user on every node")]
        result = run_job(plan, ctx.executor, Printer(plan.mask, out, color=False),
                         timeout=ctx.pf.collective_timeout_s, connected=True)
    except Exception as e:  # staging or starting failed: a result, never a traceback
        return [_fail(f"could not start: {e}", "fix the rows above (ssh, software, storage) first")]
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
        if plan is not None:
            on_nodes(ctx, lambda r: sh_script("cleanup", paths=[], dirs=[plan.run_dir]), 30)
    return rows(ctx, plan, result, out.getvalue())


def rows(ctx: Ctx, plan: LaunchPlan, result: JobResult, text: str) -> list[CheckResult]:
    """The collective row, with the transport beside the bandwidth, and the transport row."""
    per_node = node_transports(text)
    row = judge(ctx, plan, result, text)
    if not per_node:
        return [row]
    if row.status == "pass" and "busbw" in row.detail:
        # Between nodes the NET channels carry it; on one node, P2P/SHM do.
        names = sorted({"gloo/tcp" if t is None else (t.inter or t.intra or (t.network,))[0]
                        for t in per_node.values()})
        row = CheckResult(row.check, None, None, "pass", f"{row.detail} over {' and '.join(names)}")
    return [row, transport_row(per_node, ctx.pf.expect_transport)]


def node_transports(text: str) -> dict[int, "transport.Transport | None"]:
    """Each node's NCCL transport from its INFO lines; None for a node whose ranks ran gloo."""
    out: dict[int, transport.Transport | None] = {
        k: t for k, t in transport.by_node(text).items() if t.network or t.inter}
    for node, backend in BACKEND.findall(text):
        if backend == "gloo":
            out[int(node)] = None
    return dict(sorted(out.items()))


def transport_row(per_node: dict, expect: str) -> CheckResult:
    """One cluster-wide row: nodes grouped by what they used; ✗ naming the nodes that do not
    use preflight.expect_transport, with the fix."""
    verdicts = {k: transport.gloo_mismatch(expect) if t is None else transport.mismatch(t, expect)
                for k, t in per_node.items()}
    groups: dict[str, list[int]] = {}
    for k, t in per_node.items():
        said = verdicts[k][0] if verdicts[k] else ("gloo/tcp" if t is None else t.label())
        groups.setdefault(said, []).append(k)
    bad = [s for s, ks in groups.items() if verdicts[ks[0]]]
    detail = " | ".join(f"{_ranks(ks)}: {s}" for s, ks in sorted(groups.items(), key=lambda g: (g[0] not in bad, g[1])))
    fixes = list(dict.fromkeys(v[1] for v in verdicts.values() if v))
    if not fixes:
        return CheckResult("collective/transport", None, None, "pass", detail)
    return CheckResult("collective/transport", None, None, "fail",
                       f"expected {expect}; {detail}", "; ".join(fixes))


def _ranks(nodes: list[int]) -> str:
    """node0-3, node0,2 ..."""
    if len(nodes) > 2 and nodes == list(range(nodes[0], nodes[-1] + 1)):
        return f"node{nodes[0]}-{nodes[-1]}"
    return "node" + ",".join(map(str, nodes))


def judge(ctx: Ctx, plan: LaunchPlan, result: JobResult, text: str) -> CheckResult:
    """Turn the job's outcome and output into the collective row."""
    m = RESULT.search(text)
    if result.code == 0 and m:
        import json
        r = json.loads(m.group(1))
        if r["world"] == 1:
            return CheckResult("collective", None, None, "pass", "1 rank: nothing to all-reduce across")
        return CheckResult("collective", None, None, "pass",
                           f"{r['world']} ranks ({r['backend']}): correct; {r['mb']:g} MB busbw "
                           f"{r['busbw_gbps']:.2f} GB/s (algbw {r['algbw_gbps']:.2f})")
    if result.timed_out:
        return _timed_out(ctx, text)
    return _failed(ctx, result, text)


def _timed_out(ctx: Ctx, text: str) -> CheckResult:
    """How far the all-reduce got before the limit says where it is stuck."""
    t, addr, port = ctx.pf.collective_timeout_s, ctx.master_addr, ctx.master_port
    seen: dict[str, set[int]] = {"starting": set(), "joined": set()}
    for node, stage in PROGRESS.findall(text):
        seen[stage].add(int(node))
    everyone = {n.rank for n in ctx.nodes}
    if seen["starting"] != everyone:
        missing = ", ".join(f"node{r}" for r in sorted(everyone - seen["starting"]))
        return _fail(f"timed out after {t:g}s in torchrun's rendezvous at {addr}:{port} "
                     f"(no rank started on {missing}): likely a blocked port or NIC",
                     f"open TCP {port} on {addr} to every worker (security group / firewall); "
                     "see network/port-reachable")
    if seen["joined"] != everyone:
        return _fail(f"timed out after {t:g}s in init_process_group: ranks started but cannot "
                     "connect to each other",
                     "allow TCP on all ports between the nodes and check network/hostname and "
                     "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME")
    return _fail(f"timed out after {t:g}s inside the all-reduce (every rank joined): a slow or broken link",
                 "rerun with cluster.env.NCCL_DEBUG=INFO; try another NCCL_SOCKET_IFNAME or NCCL_IB_DISABLE=1")


def _failed(ctx: Ctx, result: JobResult, text: str) -> CheckResult:
    """A node exited non-zero: its last error line, and a fix for the known causes."""
    k = result.first_failure if result.first_failure is not None else 0
    node = result.nodes[k]
    lines = [ln for ln in node.tail if ln.strip()]
    why = next((ln for ln in reversed(lines) if re.search(r"Error|error|WRONG", ln)), lines[-1] if lines else "")
    why = re.sub(r"^\[[^\]]*\]\s*", "", why)[:300]
    if "WRONG" in why:
        fix = "a rank got a wrong sum: check the gpu and software/versions rows (faulty GPU/NIC, mixed NCCL)"
    elif "Address already in use" in text:
        fix = f"free TCP {ctx.master_port} on {ctx.master_addr} or set cluster.master_port to a free port"
    else:
        fix = "rerun with cluster.env.NCCL_DEBUG=INFO (and TORCH_DISTRIBUTED_DEBUG=DETAIL) to see why"
    return _fail(f"node{k} {node.host}: {node.result}" + (f": {why}" if why else ""), fix)


def _fail(detail: str, fix: str) -> CheckResult:
    """A ✗ row for the whole cluster."""
    return CheckResult("collective", None, None, "fail", detail, fix)

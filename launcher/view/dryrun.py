"""The readable dry-run: per node what a person checks before launching (host, the
environment beyond mlaunch's defaults, the GPUs, the torchrun command), with nodes that
differ only in their rank folded into one block. Built from NodePlan fields (host, argv,
env, workdir), never from the script text; `--dry-run --full` prints the scripts."""
from __future__ import annotations

import posixpath
import re

from .. import render
from ..plan.launch_plan import DEFAULT_ENV, MASK, SETUP_EXIT, LaunchPlan, NodePlan
from ..spec import SECRET_NAME
from ..spec.secret_rules import URL_CREDS

# Set by mlaunch on every node for teardown and logs; listed once in the footer.
TAGS = ("MLAUNCH_RUN_ID", "MLAUNCH_NODE_RANK", "MLAUNCH_NODE_ID")
GPUS = "CUDA_VISIBLE_DEVICES"


def node_lines(plan: LaunchPlan, how) -> list[str]:
    """The node blocks and the footer; how(node) says how its host is reached."""
    lines: list[str] = []
    for group in groups(plan.nodes):
        first = group[0]
        lines += ["", f"node {first.rank}: {first.host} ({how(first)})"] + _body(first)
        if len(group) > 1:
            rest = group[1:]
            lines.append(f"{_nodes(rest)}: as node {first.rank}, with --node-rank {_ranks(rest, '..')}")
            label = "  hosts: " if len(rest) > 1 else "  host: "
            lines.append(label + _hosts(rest, how, _pattern(how(first), first.host)))
    lines += [""] + _footer(plan)
    return lines


def groups(nodes: tuple[NodePlan, ...]) -> list[list[NodePlan]]:
    """Nodes whose argv, env and workdir are the same but for their rank, in rank order."""
    out: dict[tuple, list[NodePlan]] = {}
    for n in nodes:
        out.setdefault(signature(n), []).append(n)
    return sorted(out.values(), key=lambda g: g[0].rank)


def signature(n: NodePlan) -> tuple:
    """What the node runs with its rank taken out (--node-rank's value, the node<k> directory
    in paths, the process tags); the host is not part of it: it is listed."""
    part = re.compile(rf"/node{n.rank}(?=/|$)")
    argv = [part.sub("/node{rank}", a) for a in n.argv]
    for i, a in enumerate(argv[:-1]):
        if a == "--node-rank":
            argv[i + 1] = "{rank}"
    env = tuple((k, part.sub("/node{rank}", v)) for k, v in n.env if k not in TAGS)
    box = re.sub(rf"-n{n.rank}(?=[\s'])", "-n{rank}", n.container)
    return tuple(argv), env, n.workdir, box


def user_env(n: NodePlan) -> list[tuple[str, str]]:
    """The environment beyond mlaunch's own (defaults with their values, process tags, GPUs),
    secret values masked."""
    return [(k, MASK if SECRET_NAME.search(k) or URL_CREDS.search(v) else v) for k, v in n.env
            if k not in TAGS and k != GPUS and DEFAULT_ENV.get(k) != v]


def _body(n: NodePlan) -> list[str]:
    env = dict(n.env)
    nproc = _flag(n.argv, "--nproc-per-node") or "?"
    # Without CUDA_VISIBLE_DEVICES each process takes the GPU of its LOCAL_RANK: cuda:0..N-1.
    count = int(nproc) if nproc.isdigit() else 0
    on = f"cuda:0–{count - 1}" if count > 1 else "cuda:0"
    gpus = (f"GPUs {env[GPUS]} ({GPUS})" if GPUS in env else
            f"on {on} by LOCAL_RANK ({GPUS} not set; CPU on a host without GPUs)")
    lines = [f"  processes: {nproc}, {gpus}"]
    extra = user_env(n)
    if extra:
        lines.append("  env: " + " ".join(f"{k}={_shown(v)}" for k, v in extra))
        refs = sorted({r for _, v in extra if isinstance(v, render.NodeValue) for r in v.refs})
        if refs:
            lines.append("  expanded on each node from its own environment: "
                         + ", ".join(f"${{{r}}}" for r in refs)
                         + " (a ':' beside one at either end is added only when it is set)")
    cd = f"cd {render.command_line([n.workdir])} && " if n.workdir else ""
    if n.container:
        lines += _container(n)
        cd = ""
    lines.append("  " + cd + render.command_line(n.argv))
    return lines


def _container(n: NodePlan) -> list[str]:
    """The node's runtime line (cluster.container), before the command it wraps."""
    if n.container.startswith("--container-image"):
        return ["  in the image, by srun's options: " + n.container]
    return ["  in a container: " + n.container + " \\"]


def _pattern(text: str, host: str) -> str:
    """text with host (as a whole name, not inside `train@` for a host `a`) made a {} slot."""
    text = text.replace("{", "{{").replace("}", "}}")
    return re.sub(rf"(?<![\w.-]){re.escape(host)}(?![\w.-])", "{}", text, count=1)


def _shown(value: str) -> str:
    """An env value as the user wrote it: node references shown bare, the rest quoted."""
    if isinstance(value, render.NodeValue):
        return "".join(f"${{{p}}}" if type(p) is not str else render.command_line([p])
                       .replace("$", "$$") for p in value.parts)
    return render.command_line([value])


def _hosts(group: list[NodePlan], how, pattern: str) -> str:
    """The hosts of a folded block; each with how it is reached when that differs from the first's."""
    same = all(how(n) == pattern.format(n.host) for n in group)
    return ", ".join(n.host if same else f"{n.host} ({how(n)})" for n in group)


def _footer(plan: LaunchPlan) -> list[str]:
    """What every node script adds around the command, in two or three lines."""
    n = plan.nodes[0]
    defaults = " ".join(f"{k}={v}" for k, v in n.env if DEFAULT_ENV.get(k) == v)
    path = posixpath.dirname(n.argv[0])
    every = plan.job.health.sample_every_s
    sampler = ([f"  the live view's samples every {every:g}s (nvidia-smi's, or the node relay's of CPU and "
                "memory where there is no GPU), over the node's own session; health.sample_every_s: "
                "0 turns them off;"]
               if every and not plan.unheld else [])
    warm = (["  torchrun's interpreter started at login, its imports done while mlaunch checks the nodes, "
             "handed the launch once they pass (cluster.warm_start; it declines where a setup line "
             "changed what an import reads);"] if n.warm else [])
    return [f"every node also: {defaults}{', PATH=' + path + ':$PATH' if path else ''}, the MLAUNCH_* "
            "process tags,", *_setup(plan),
            f"  a hang-up guard ({plan.job.cluster.hangup_after_s:g}s without the launcher ends the node's "
            "processes);", *sampler, *warm, "  --dry-run --full prints the exact scripts"]


def _setup(plan: LaunchPlan) -> list[str]:
    """cluster.setup in the footer: every line, in order."""
    setup = plan.job.cluster.setup
    if not setup:
        return []
    return ["  cluster.setup before torchrun, in the node's shell (a failing line fails that node, "
            f"exit {SETUP_EXIT}): " + "; ".join(setup) + ";"]


def _flag(argv: tuple[str, ...], name: str) -> str | None:
    """The value after a flag in argv, if present."""
    for a, b in zip(argv, argv[1:]):
        if a == name:
            return b
    return None


def _nodes(group: list[NodePlan]) -> str:
    return ("node " if len(group) == 1 else "nodes ") + _ranks(group, "–")


def _ranks(group: list[NodePlan], dash: str) -> str:
    """1–3 (or 1..3) for a run of ranks, else 1, 3, 4."""
    r = [n.rank for n in group]
    if len(r) > 2 and r == list(range(r[0], r[-1] + 1)):
        return f"{r[0]}{dash}{r[-1]}"
    return ", ".join(map(str, r))

"""Talking to the nodes: one rendered script per node, all nodes at once, JSON back."""
from __future__ import annotations

import json
import posixpath
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from .. import nodeprog, render
from ..transport.base import Executor
from ..plan import container as containers
from ..plan.launch_plan import (LaunchPlan, NodePlan, in_process, node_python, remote_bin, remote_python,
                                torchrun_path)
from ..spec.rules import node_devices
from ..spec import LlamaFactoryJob, ScriptJob

MARKER = "MLAUNCH-PREFLIGHT "  # prefix of the one JSON line a probe prints; login noise is ignored
# The distribution each trainer runs, whose version must match across nodes.
TRAINER_PACKAGES = {"llamafactory": "llamafactory", "swift": "ms-swift"}
# report_to -> the modules transformers' callback imports (any one of them will do).
TRACKER_MODULES = {"tensorboard": ["tensorboard", "tensorboardX"], "wandb": ["wandb"],
                   "mlflow": ["mlflow"], "swanlab": ["swanlab"]}
# LLaMA-Factory options (passthrough) that import a package of their own at start, with the
# module it imports and the pip name: a node without it stops the run on every rank.
FEATURE_MODULES = {"enable_liger_kernel": ("liger_kernel", "liger-kernel"), "use_unsloth": ("unsloth", "unsloth"),
                   "use_badam": ("badam", "badam"), "use_galore": ("galore_torch", "galore-torch"),
                   "use_apollo": ("apollo_torch", "apollo-torch"), "use_adam_mini": ("adam_mini", "adam-mini")}


def features(job) -> list[list[str]]:
    """[option, module, pip name] of each package-backed option the job turns on."""
    pt = getattr(job, "passthrough", None) or {}
    if getattr(job, "trainer", None) != "llamafactory":
        return []
    return [[k, *FEATURE_MODULES[k]] for k in FEATURE_MODULES if pt.get(k) is True]


@dataclass
class Outcome:
    """What one script run on one node gave back, with launcher-side send/receive times."""

    code: int
    output: str
    t_send: float
    t_recv: float

    def json(self) -> dict | None:
        """The probe's JSON line, or None when the probe never printed one."""
        for line in reversed(self.output.splitlines()):
            if line.startswith(MARKER):
                try:
                    return json.loads(line[len(MARKER):])
                except ValueError:
                    return None
        return None

    def why(self) -> str:
        """One line on why no JSON came back: timeout, lost connection, or the last output."""
        last = next((ln.strip() for ln in reversed(self.output.splitlines()) if ln.strip()), "")
        return f"exit {self.code}" + (f": {last[:200]}" if last else "")


@dataclass
class Ctx:
    """One preflight run: the plan, the connected executor, and which nodes can be reached."""

    plan: LaunchPlan
    executor: Executor
    unreachable: dict[int, str] = field(default_factory=dict)   # rank -> why SSH failed
    nonce: str = field(default_factory=lambda: secrets.token_hex(4))
    fast_only: bool = False   # submit's fast checks: no probe may import torch (seconds a node)

    @property
    def job(self):
        return self.plan.job

    @property
    def pf(self):
        return self.plan.job.preflight

    @property
    def nodes(self) -> tuple[NodePlan, ...]:
        return self.plan.nodes

    @property
    def live(self) -> list[int]:
        """Ranks that SSH reached: the only ones any probe runs on."""
        return [n.rank for n in self.nodes if n.rank not in self.unreachable]

    @property
    def python(self) -> str:
        """The remote interpreter the job will use: cluster.python itself (not a `python`
        beside it: /usr/bin/python3 has none), the venv's, else python3 on PATH."""
        return remote_python(self.job)

    @property
    def rendezvous(self) -> bool:
        """torchrun's store binds master_port; a job of one in-process rank binds none."""
        return not in_process(self.job)

    @property
    def master_addr(self) -> str:
        """cluster.master_addr, else the master the transport placed (a Ray backend's bundle
        0's node), else hosts[0]."""
        placed = getattr(self.executor, "master_addr", None)
        return self.job.cluster.master_addr or placed or self.nodes[0].host

    @property
    def master_port(self) -> int:
        return self.job.cluster.master_port

    def shared_name(self, rank: int) -> str | None:
        """The marker file node `rank` writes into shared_dir for the visibility check."""
        d = self.job.cluster.shared_dir
        return posixpath.join(d, f".mlaunch-preflight-{self.nonce}-node{rank}") if d else None


def on_nodes(ctx: Ctx, script_for: Callable[[int], str | None], timeout: float,
             ranks: list[int] | None = None) -> dict[int, Outcome]:
    """Run each node's script on its host, every node at once; outcomes by rank.

    At once, not in batches: the mesh's listeners and dialers must all run in the same window
    (with 32 at a time, a 64-node check failed: the second half dialed listeners whose
    probes had ended, "connection refused"). A thread each only waits on its ssh client."""
    ranks = ctx.live if ranks is None else ranks
    jobs = {r: s for r in ranks if (s := script_for(r)) is not None}
    if not jobs:
        return {}

    def one(rank: int) -> tuple[int, Outcome]:
        t_send = time.time()
        code, out = ctx.executor.run(ctx.nodes[rank].login, jobs[rank], timeout)
        return rank, Outcome(code, out, t_send, time.time())

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return dict(pool.map(one, jobs))


def py_script(ctx: Ctx, rank: int, program: str, params: dict, in_image: bool = False) -> str:
    """Shell text that runs node program launcher/nodeprog/<program>.py with the job's interpreter
    and environment (so LD_LIBRARY_PATH, PYTHONPATH, ... are those the job will see).
    Under cluster.container the job's interpreter is in the image: in_image runs the program
    there (after the runtime and image checks), else on the host's python3."""
    node, job = ctx.nodes[rank], ctx.job
    box: dict = {"container": None}
    if in_image:
        box = dict(container=containers.probe_line(
            job, name=f"mlaunch-preflight-{ctx.nonce}-n{rank}", env_names=[k for k, _ in node.env],
            devices=node_devices(job.cluster, rank)), problems=containers.probe_problems(job),
            runtime=containers.command(job), image=job.cluster.container.image,
            pull=job.cluster.container.pull)
    return render.render("preflight/pyprobe.sh.j2", env=list(node.env), bindir=remote_bin(job),
                         python=ctx.python if in_image or job.cluster.container is None else node_python(job),
                         program=program, source=nodeprog.source(program),
                         params=json.dumps({**params, "marker": MARKER.strip()}), marker=MARKER.strip(),
                         **box)


def facts_params(ctx: Ctx, rank: int) -> dict:
    """What the facts probe needs to know about node `rank`'s part of the job."""
    job, c = ctx.job, ctx.job.cluster
    return {
        "rank": rank, "nonce": ctx.nonce, "bindir": remote_bin(job), "workdir": c.workdir,
        # the torchrun file mlaunch runs; None: `python -m torch.distributed.run` or PATH's
        "torchrun": torchrun_path(job) if remote_bin(job) else None,
        "trainer_pkg": TRAINER_PACKAGES.get(job.trainer),
        "tracker": TRACKER_MODULES.get(getattr(job, "report_to", "none")),
        "features": features(job),
        "master_addr": ctx.master_addr if rank == 0 and ctx.rendezvous else None,
        "out_dir": job.output_dir or c.workdir or posixpath.dirname(posixpath.dirname(ctx.plan.run_dir)),
        "shared_file": ctx.shared_name(rank), "inputs": input_specs(job),
        # node 0 sends the model's config.json back for batch planning (launcher/plan/batch.py)
        "model_config": job.model if rank == 0 and isinstance(getattr(job, "model", None), str) else None,
        "budget": max(1.0, ctx.pf.check_timeout_s - 2.0), "import_torch": not ctx.fast_only,
    }


def input_specs(job) -> list[dict]:
    """The paths the job reads at start, each with how the node should check it."""
    if isinstance(job, ScriptJob):
        s = job.script
        return [{"what": "script", "kind": "file", "path": s.path} if s.path else
                {"what": "module", "kind": "module", "path": s.module}]
    model = getattr(job, "model", None)
    out = [{"what": "model", "kind": "model", "path": model}] if isinstance(model, str) else []
    raw = getattr(job, "dataset", None) or []
    names = [p.strip() for name in ([raw] if isinstance(raw, str) else raw) for p in name.split(",") if p.strip()]
    if isinstance(job, LlamaFactoryJob):  # names are keys of dataset_dir/dataset_info.json
        out.append({"what": "dataset", "kind": "dataset", "path": job.dataset_dir or "data", "names": names,
                    "stage": job.stage})
    else:  # ms-swift style: hub ids, or local files/dirs (with an optional "#samples" suffix)
        out += [{"what": "dataset", "kind": "path", "path": n.split("#")[0]} for n in names
                if n.startswith(("/", ".", "~"))]
    return out


def gather_facts(ctx: Ctx, mesh: dict[int, dict] | None = None) -> dict[int, dict | str]:
    """The cheap facts of every node in one round trip each: a dict, or why there is none.
    mesh: each node's plan of the mesh's first round, run by the same probe (its answer under
    "mesh"; network.first_round)."""
    box = ctx.job.cluster.container
    if box is not None and box.runtime in ("podman", "docker"):
        return _facts_with_image(ctx, mesh or {})
    outs = on_nodes(ctx, lambda r: py_script(ctx, r, "facts", {**facts_params(ctx, r), "mesh": (mesh or {}).get(r)}),
                    ctx.pf.check_timeout_s)
    return {r: (o.json() or f"facts probe failed ({o.why()})") for r, o in outs.items()}


class ContainerProblem(str):
    """A node's facts when its container runtime or image failed the checks: what is wrong,
    with the fix (software.check_python reports both)."""

    def __new__(cls, detail: str, fix: str) -> "ContainerProblem":
        obj = super().__new__(cls, detail)
        obj.fix = fix
        return obj


def _facts_with_image(ctx: Ctx, mesh: dict[int, dict]) -> dict[int, dict | str]:
    """cluster.container: the host's facts (storage, network, ports) from the host's python3,
    the software's (interpreter, torch, trainer, GPUs as the container sees them) from a run
    inside the image; both at once."""
    soft = containers.software_facts()
    with ThreadPoolExecutor(max_workers=2) as pool:
        host = pool.submit(on_nodes, ctx, lambda r: py_script(ctx, r, "facts", {
            **facts_params(ctx, r), "only": [k for k in ALL_FACTS if k not in soft], "mesh": mesh.get(r)}),
            ctx.pf.check_timeout_s)
        image = pool.submit(on_nodes, ctx, lambda r: py_script(ctx, r, "facts", {
            **facts_params(ctx, r), "only": list(soft), "workdir": None}, in_image=True),
            ctx.pf.check_timeout_s + IMAGE_START_S)
        host_outs, image_outs = host.result(), image.result()
    out: dict[int, dict | str] = {}
    for r, o in host_outs.items():
        h, i = o.json(), image_outs[r].json() if r in image_outs else None
        if i is not None and "container" in i:
            out[r] = ContainerProblem(*i["container"])
        elif h is None or i is None:
            why = o.why() if h is None else image_outs[r].why()
            out[r] = f"facts probe failed ({why})"
        else:
            out[r] = {**h, **i}
    return out


# Every key of nodeprog/facts.py's FACTS (some only on node 0 or with a model).
ALL_FACTS = ("python", "torch", "trainer", "torchrun", "host", "mesh_port", "out", "shared",
             "inputs", "shm", "gpu", "ext_locks", "pyspy", "master", "model_config", "mesh")
IMAGE_START_S = 60.0   # a container's start (and a pull's) on top of the probe's own limit


def sh_script(name: str, **context) -> str:
    """A small shell probe from templates/preflight/<name>.sh.j2."""
    return render.render(f"preflight/{name}.sh.j2", **context)


def cleanup(ctx: Ctx) -> None:
    """Remove what the probes left on the nodes (the shared_dir marker files)."""
    if ctx.job.cluster.shared_dir:
        on_nodes(ctx, lambda r: sh_script("cleanup", paths=[ctx.shared_name(r)], dirs=[]), 15)

"""The launch plan: a pure, immutable description of everything `submit` will do."""
from __future__ import annotations

import getpass
import os
import posixpath
import re
import secrets as _secrets
import time
from dataclasses import dataclass

from . import batch as batchplan
from . import container as containers
from .. import nodeprog, render
from ..spec import JobBase
from ..spec.secret_rules import mask_text, secret_env, secret_values
from ..spec.hosts import LOOPBACK, HostAddr, host_addrs
from ..spec.rules import node_devices
from ..spec.select import node_procs, procs_of, world_size
from ..spec import env_refs
from .trainers import TRAINERS, RenderedFile, RunContext

# Defaults learned the hard way; a user's cluster.env overrides them.
DEFAULT_ENV = {
    "PYTHONUNBUFFERED": "1",  # lines reach the launcher as they are printed
    # A rank whose peer died raises instead of waiting in a collective forever.
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}
MASK = "***"
HANGUP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL when a node loses its launcher
SETUP_EXIT = 95   # a cluster.setup line failed on the node (96: its run dir or workdir)
SECRETS_FILE = "secrets/env.sh"  # under run_dir (0700 dir, 0600 file): placed runs only


@dataclass(frozen=True)
class NodePlan:
    """One node rank: where it runs, what it runs, and where its log goes."""

    rank: int
    host: str            # the host name alone: torchrun, preflight and logs see this
    login: str           # the SSH destination, [user@]host[:port]: the executor's key
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    workdir: str | None
    pidfile: str
    log_path: str
    script: str          # the exact shell text run on the node
    display: str         # the same text with secret values masked
    container: str = ""  # cluster.container: the runtime line before argv (pyxis: srun's options)
    container_rm: str = ""   # shell text that removes the node's container by name ("" none)
    warm: str = ""       # the session's warm frame (templates/warm.sh.j2; "" none), secrets in it
    warm_display: str = ""   # the same frame made from the masked environment


@dataclass(frozen=True)
class LaunchPlan:
    """Everything submit does, computed before any connection is made."""

    job: JobBase
    run_id: str
    run_dir: str
    local: bool              # every host is this machine: no SSH
    shared: bool             # every node sees run_dir at the same path
    log_dir: str
    nodes: tuple[NodePlan, ...]
    files: tuple[RenderedFile, ...]
    secrets: tuple[str, ...]
    resume_from: str | None = None
    attempt: int = 0          # 0 for the first launch, n for the n-th automatic restart
    batch: batchplan.Decision | None = None   # the batch numbers rendered, and why
    tag: str = ""             # the attempt's MLAUNCH_RUN_ID on every process (attempt_tag)
    made: tuple = ()          # build_plan's inputs that made it, the job as given (before the
                              # batch was filled in) among them: replanned() keeps them

    def mask(self, text: str) -> str:
        """text with every secret value replaced, for anything printed or logged."""
        return mask_text(text, self.secrets, MASK)

    @property
    def placement(self) -> "Placement | None":
        """The scheduler's placement the plan was made with; None: the spec's hosts."""
        return dict(self.made).get("placement")

    @property
    def unheld(self) -> bool:
        """A scheduler's nodes, held by no session of mlaunch's between attempts (Slurm): the
        output_dir helpers run on this machine, a command for node 0 is a job of its own. A
        plan on hosts, or on places the backend holds (Ray's bundles), is not."""
        return self.placement is not None and not self.placement.guarded

    def replanned(self, **changes) -> "LaunchPlan":
        """This plan made again with some of build_plan's inputs changed: the next attempt's
        (attempt, resume_from, ...) or one on other hosts (job=), from the recorded plan
        rather than from the spec: its job already holds the batch preflight decided."""
        kw = {**dict(self.made), **changes}
        return build_plan(kw.pop("job"), **kw)

    @property
    def given_job(self) -> JobBase:
        """The job as given to build_plan: batch fields left to mlaunch still unset, for
        preflight to decide from the nodes' GPU memory."""
        return dict(self.made)["job"]


@dataclass(frozen=True)
class Placement:
    """Where node ranks run when a scheduler places them (a backend's placement(job)); the
    spec's hosts when a plan has none. The rendered node script reads its rank, its host and
    the master from the variables named here once the allocation exists."""

    nodes: int                # how many node ranks
    master: str               # the master address, as the node's shell reads it
    rank_var: str             # the variable that holds the node's rank; "": ranks are fixed
                              # (node i is the backend's i-th place), rendered as numbers
    host: str = "(allocated)"   # each node's host until the allocation names it ({rank}: its rank)
    secrets_in_file: bool = True   # the scheduler keeps what it runs: secret values go to a
                                   # 0600 file the node sources, never into the script
    # No node is held between attempts: output_dir's helpers run on this (login) node, and a
    # command for node 0 (a checkpoint's conversion) is a one-node job of its own, this one.
    one_node_job: str = "a one-node job"
    # mlaunch, not the scheduler, ends the node's processes: the node keeps its pidfile, its
    # hang-up guard and the live view's sampler, as a host's session does (Ray's bundles).
    guarded: bool = False


# A run id names files and directories (logs/<id>/, the run dir) and is matched, as a fixed
# string, in every process's environment: `name`'s characters, and room for the generated
# suffix (-<UTC time>-<random>, 21 characters) after a 64-character name.
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")   # always fullmatch
# Attempt N>0 of run X runs as X+aN (attempt_tag): '+' is in no run id, so no run's id is
# another run's attempt tag, and no sweep of one run matches another's processes.
TAG_MARK = "+a"


def check_run_id(run_id: str) -> str:
    """run_id if it is one path component of safe characters (the whole string: a trailing
    newline would split the teardown script); else UserError (exit 2)."""
    from ..errors import UserError
    shown = run_id if len(run_id) <= 80 else run_id[:77] + "..."
    if not RUN_ID_RE.fullmatch(run_id):
        raise UserError(f"--run-id {shown!r}: a run id is 1-128 letters, digits, '.', '_' or '-', "
                        "starting with a letter or digit (no '/', no '..'); give such an id, or "
                        "leave --run-id out for a fresh one")
    return run_id


def attempt_tag(run_id: str, attempt: int) -> str:
    """The MLAUNCH_RUN_ID of an attempt's processes: the run id for attempt 0, else
    <run_id>+a<N>, so that one attempt's teardown never reaches another's processes."""
    return run_id if attempt == 0 else f"{run_id}{TAG_MARK}{attempt}"


def new_run_id(name: str) -> str:
    """A sortable, unique run id: <job name>-<UTC time>-<random>."""
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{_secrets.token_hex(2)}"


def build_plan(job: JobBase, *, run_id: str | None = None, log_dir: str | None = None,
               resume_from: str | None = None, overwrite: bool | str | None = False,
               attempt: int = 0, transformers: str | None = None,
               memory: batchplan.MemoryInputs | None = None, universal: bool = False,
               placement: Placement | None = None) -> LaunchPlan:
    """Turn a validated job into the per-node commands and the files they read.

    Each restart attempt gets its own process tag (attempt_tag) and its own log files, so
    that teardown and logs of one attempt never mix with another's. Batch fields left to
    mlaunch are filled in first (batchplan, from `memory`), so every file renders the same
    numbers; refusing an unfit batch is the caller's (batchplan.Decision.problems).
    placement: a scheduler's (its backend's placement(job)); None: the spec's hosts.
    """
    if placement is None and job.cluster.scheduler != "ssh":
        raise ValueError(f"cluster.scheduler {job.cluster.scheduler}: its plan needs the backend's "
                         "placement: launcher.backends.backend_of(job).plan(job, ...)")
    made = (("job", job), ("log_dir", log_dir), ("transformers", transformers),
            ("placement", placement))
    decision = batchplan.resolve(job, memory)
    job = decision.job if decision else job
    run_id = check_run_id(new_run_id(job.name) if run_id is None else run_id)
    made += (("run_id", run_id),)
    c = job.cluster
    addrs = node_addrs(job, placement)
    run_dir = run_dir_of(job, run_id)
    tag = attempt_tag(run_id, attempt)
    run = RunContext(run_id=tag, run_dir=run_dir, resume_from=resume_from, overwrite=overwrite,
                     transformers=transformers, universal=universal)
    trainer = TRAINERS[job.trainer]
    log_base = os.path.join(log_dir or job.output_dir or "mlaunch-logs", "logs", run_id)
    argv_tail = tuple(trainer.entry(job, run))
    suffix = f".attempt{attempt}" if attempt else ""
    solo = in_process(job)
    master = render.ShellVar(placement.master) if placement else c.master_addr or addrs[0].name
    nodes = tuple(_node(job, rank, addr, master, run, argv_tail, log_base, suffix, solo, placement)
                  for rank, addr in enumerate(addrs))
    local = placement is None and all_local(job)
    return LaunchPlan(job=job, run_id=run_id, run_dir=run_dir, local=local,
                      shared=bool(c.shared_dir) or local, log_dir=log_base, nodes=nodes,
                      files=tuple(trainer.files(job, run)), secrets=secret_values(job),
                      resume_from=resume_from, attempt=attempt, batch=decision, tag=tag, made=made)


def all_local(job: JobBase) -> bool:
    """Every host is this machine, reached without SSH (a loopback host with its own user or
    port is an sshd to log in to, e.g. a container's)."""
    return bool(job.cluster.hosts) and all(LOOPBACK.match(a.name) and a.login == a.name
                                           for a in host_addrs(job.cluster.hosts))


def run_dir_of(job: JobBase, run_id: str) -> str:
    """The node-side directory of a run's files and pidfiles, one per user: under a shared_dir
    or workdir, <dir>/.mlaunch/<user>/<run_id> (.mlaunch is shared by the team, 1777 and
    sticky; <user> is this user's, 0700: templates/private_dirs.sh.j2); without either,
    /tmp/mlaunch-<user>/.mlaunch/<run_id>, all of it this user's."""
    base = user_base(job)
    return posixpath.join(base or default_base(job) + "/.mlaunch", run_id)


def user_base(job: JobBase) -> str | None:
    """<shared_dir|workdir>/.mlaunch/<user>: this user's folder in the team's .mlaunch, where
    the run directories go; None without shared_dir or workdir."""
    c = job.cluster
    return posixpath.join(c.shared_dir or c.workdir, ".mlaunch", node_user(job)) if (
        c.shared_dir or c.workdir) else None


def default_base(job: JobBase) -> str:
    """Where a run's files go without shared_dir or workdir: /tmp/mlaunch-<user>, one per user
    (a shared /tmp/mlaunch would belong to whoever made it first). Not $XDG_RUNTIME_DIR: a
    node's is removed when its last login session ends, with a detached run's pidfiles in it."""
    return f"/tmp/mlaunch-{node_user(job)}"


def node_user(job: JobBase) -> str:
    """The user the run's node-side files belong to, as a file name: the login user the hosts
    name when they agree, else this machine's user."""
    users = {a.user or job.cluster.ssh.user for a in host_addrs(job.cluster.hosts or [])} or {
        job.cluster.ssh.user}
    user = users.pop() if len(users) == 1 and None not in users else getpass.getuser()
    name = re.sub(r'[^A-Za-z0-9._-]', '_', user)
    return "_" if name in (".", "..") else name


def uses_default_base(job: JobBase) -> bool:
    """The run dir is under default_base: mlaunch makes that directory too, 0700."""
    return not (job.cluster.shared_dir or job.cluster.workdir)


def node_addrs(job: JobBase, placement: Placement | None = None) -> list[HostAddr]:
    """Each node rank's host; a placed rank's is a placeholder until the allocation names it."""
    if placement is not None:
        return [HostAddr(placement.host.format(rank=r)) for r in range(placement.nodes)]
    return host_addrs(job.cluster.hosts)


SYSTEM_BIN = ("/usr/bin", "/bin")   # the distribution's interpreters: no pip scripts beside them


def remote_bin(job: JobBase) -> str | None:
    """Directory of the remote interpreter, which also holds torchrun."""
    c = job.cluster
    if c.venv:
        return posixpath.join(c.venv, "bin")
    return posixpath.dirname(c.python) if c.python else None


def torchrun_path(job: JobBase) -> str | None:
    """The torchrun the nodes start: the one beside the interpreter (a venv's, conda's,
    /usr/local/bin's), else PATH's; None for the distribution's own interpreter in /usr/bin or
    /bin, beside which pip never installs scripts (root's go to /usr/local/bin, a user's to
    ~/.local/bin): that one runs torchrun's own module (templates/torchrun.j2)."""
    c = job.cluster
    if c.python and posixpath.dirname(c.python) in SYSTEM_BIN and not c.venv:
        return None
    bindir = remote_bin(job)
    return posixpath.join(bindir, "torchrun") if bindir else "torchrun"


def _torchrun_argv(job: JobBase, rank: int, master: str, run: RunContext,
                   tail: tuple[str, ...], placement: Placement | None) -> tuple[str, ...]:
    """torchrun with mlaunch's rendezvous for node `rank`, then the trainer's entry."""
    c = job.cluster
    return (*render.torchrun_argv(
        torchrun=torchrun_path(job), python=c.python, nnodes=nnodes(job),
        nproc=procs_of(c, rank), node_rank=_per_node("", rank, placement), master_addr=master,
        master_port=c.master_port,
        log_dir=_per_node(posixpath.join(run.run_dir, "torchrun", "node"), rank, placement)),
        *tail)


def remote_python(job: JobBase) -> str:
    """The interpreter the nodes run: cluster.python, the venv's, else python3 on PATH."""
    c = job.cluster
    return c.python or (posixpath.join(c.venv, "bin", "python") if c.venv else "python3")


HOST_PYTHON = "python3"   # mlaunch's node programs on a container's host (stdlib only)


def node_python(job: JobBase) -> str:
    """The interpreter of mlaunch's own node programs (the relay, output_dir's helper, the
    preflight probe) on the node's host: the job's interpreter, except under cluster.container,
    where that one is inside the image and the host's python3 runs them."""
    return HOST_PYTHON if job.cluster.container is not None else remote_python(job)


def in_process(job: JobBase) -> bool:
    """The whole job is one process and its trainer runs that without torchrun."""
    return (job.cluster.torchrun == "auto" and world_size(job) == 1
            and TRAINERS[job.trainer].in_process and not getattr(job, "deepspeed", None)
            # The HF Trainer refuses FSDP outside a process group ("only works in
            # distributed training"), even for one process: torchrun makes one.
            and not getattr(job, "fsdp", None))


def _node(job: JobBase, rank: int, addr: HostAddr, master: str, run: RunContext,
          tail: tuple[str, ...], log_base: str, suffix: str, solo: bool = False,
          placement: Placement | None = None) -> NodePlan:
    c, host = job.cluster, addr.name
    bindir = remote_bin(job)
    argv = (remote_python(job), *tail) if solo else _torchrun_argv(job, rank, master, run, tail, placement)
    node_rank = _per_node("", rank, placement)
    node_id = _per_node(f"{run.run_id}.node", rank, placement)
    env = {**DEFAULT_ENV, **TRAINERS[job.trainer].env, **user_env(c.env), "MLAUNCH_RUN_ID": run.run_id, "MLAUNCH_NODE_RANK": node_rank,
           "MLAUNCH_NODE_ID": node_id}
    if solo:   # what tells the stack dump (templates/stacks.sh.j2) which process is the rank
        env["MLAUNCH_IN_PROCESS"] = "1"
    devices = node_devices(c, rank)
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
    pidfile = posixpath.join(run.run_dir, f"node{rank}.pid")
    line, rm = _container(job, node_rank, run, list(env), devices)
    hangup = render.teardown_script(f"MLAUNCH_NODE_ID={node_id}", [pidfile], HANGUP_GRACE,
                                    containers=[rm] if rm else None)
    in_file = bool(placement and placement.secrets_in_file)
    ctx = dict(run_id=run.run_id, rank=node_rank, nnodes=nnodes(job), host=host, bindir=bindir,
               run_dir=run.run_dir, workdir=c.workdir, pidfile=pidfile, argv=argv, hangup=hangup,
               hangup_after=f"{c.hangup_after_s:g}", solo=solo,
               placed=placement is not None and not placement.guarded,
               secrets_file=posixpath.join(run.run_dir, SECRETS_FILE) if in_file else None,
               sampler=None if placement and not placement.guarded else _sampler(job, run.run_id),
               setup=list(c.setup),
               setup_exit=SETUP_EXIT, container=None if _srun_side(job) else line or None,
               container_rm=rm or None, warm=_warm(job, argv, line, placement),
               private_dirs=render.private_dirs_script(run.run_dir, uses_default_base(job)))
    masked = [(k, MASK if secret_env(job, k, v) else v) for k, v in env.items()]
    if in_file:  # secret values stay in a 0600 file the node sources
        masked = [(k, m) for (k, v), (_, m) in zip(env.items(), masked) if not secret_env(job, k, v)]
        env = {k: v for k, v in env.items() if not secret_env(job, k, v)}
    safe_host = re.sub(r"[^A-Za-z0-9._-]", "_", host)
    return NodePlan(rank=rank, host=host, login=addr.login, argv=argv, env=tuple(env.items()),
                    workdir=c.workdir,
                    pidfile=pidfile, log_path=os.path.join(log_base, f"node{rank}-{safe_host}{suffix}.log"),
                    script=render.node_script(env=list(env.items()), **ctx),
                    display=render.node_script(env=masked, **ctx), container=line,
                    container_rm=rm,
                    **_warm_frames(ctx["warm"], argv, env, masked, bindir, c.workdir))


def _warm_frames(warm: bool, argv: tuple[str, ...], env: dict, masked: list, bindir: str | None,
                 workdir: str | None) -> dict:
    """The node's warm frame and its display copy, made from the masked environment (a secret
    quoted for the shell is no longer the text plan.mask looks for)."""
    if not warm:
        return {}
    program = nodeprog.source("warm")
    return {"warm": render.warm_frame(program, argv, list(env.items()), bindir, workdir),
            "warm_display": render.warm_frame(program, argv, masked, bindir, workdir)}


def _warm(job: JobBase, argv: tuple[str, ...], container: str, placement: Placement | None) -> bool:
    """cluster.warm_start applies: torchrun on an SSH host, outside a container (a scheduler
    starts its own processes; a container's interpreter is the image's; this machine's own
    nodes have no login to overlap), each host running one node (two nodes of one host share
    its login session, which holds one warm torchrun: transport/ssh.py sends none then)."""
    hosts = list(job.cluster.hosts or ())
    return (job.cluster.warm_start and placement is None and not container and not all_local(job)
            and len(set(hosts)) == len(hosts)
            and (posixpath.basename(argv[0]) == "torchrun" or argv[1:3] == ("-m", "torch.distributed.run")))


def _container(job: JobBase, node_rank, run: RunContext, env_names: list[str],
               devices: list[int] | None) -> tuple[str, str]:
    """The node's runtime line and the text that removes its container ("" without one)."""
    if job.cluster.container is None:
        return "", ""
    name = containers.container_name(run.run_id.split(TAG_MARK)[0], run_attempt(run.run_id),
                                     None if _srun_side(job) else node_rank)
    line = containers.runtime_line(job, name=name, run_dir=run.run_dir, env_names=env_names,
                                   devices=devices)
    return line, containers.removal(job, name) or ""


def run_attempt(tag: str) -> int:
    """The attempt number in a process tag (attempt_tag): 0 for the run id itself."""
    return int(tag.rsplit(TAG_MARK, 1)[1]) if TAG_MARK in tag else 0


def _srun_side(job: JobBase) -> bool:
    """The container is made by srun's own options (pyxis), not by the node script."""
    k = job.cluster.container
    return k is not None and k.runtime == "pyxis"


def user_env(env: dict[str, str]) -> dict[str, str]:
    """cluster.env as the node script sets it: values with `$NAME` references become
    render.NodeValue (expanded by the node's shell), the others their literal text."""
    out: dict[str, str] = {}
    for name, value in env.items():
        node = env_refs.node_parts(name, value)
        out[name] = render.NodeValue(node) if node else env_refs.literal(name, value)
    return out


def _sampler(job: JobBase, run_id: str) -> str | None:
    """The live view's sampler for a node session (placed nodes write to files: none)."""
    every = job.health.sample_every_s
    return render.sampler_script(run_id, every) if every else None


def nnodes(job: JobBase) -> int:
    """torchrun's --nnodes: the hosts, or the nodes a scheduler allocates."""
    return len(node_procs(job.cluster))


def _per_node(prefix: str, rank: int, placement: Placement | None) -> str:
    """prefix + the node rank; for a placed node the rank its shell reads from the
    placement's variable."""
    return render.ShellVar(placement.rank_var, prefix) if placement and placement.rank_var else f"{prefix}{rank}"

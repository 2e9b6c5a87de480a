"""The Ray transport (launcher/transport/base.py's Executor): a placement group of one bundle
per node, strictly spread, and one NodeAgent actor (agent.py) on each bundle that runs the
node's session and its short scripts. Logins are the plan's per-node names (bundle<rank>),
each mapped to its bundle's agent. Node 0's IP, known once Ray has placed the group, is the
master address every node's torchrun dials (MLAUNCH_MASTER_ADDR in the node's environment).

Imported only when a run really reaches Ray (the dry run and `mlaunch ps` import no ray).
"""
from __future__ import annotations

import functools
import os
import queue
import tempfile
import threading

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ... import nodeprog, render
from ...errors import Problem, UserError
from ...plan.launch_plan import LaunchPlan, NodePlan
from ...transport.base import LOST, Exit, drop_logs_by_run, setup_failed, stage_text
from ...transport.relay import relay_config
from ...transport.spool import Spool
from . import agent as agent_module
from .connect import connect, group_name, agent_name
from .lost import fits, lost_ips

TAKE_WAIT_S = 1.0      # how long one take() waits on the node for output
CALL_SLACK_S = 30.0    # a call's limit beyond its own (a loaded cluster answers late)
MASTER_VAR = "MLAUNCH_MASTER_ADDR"


class RayExecutor:
    """Places the run's nodes on a Ray cluster and reaches each through its agent."""

    def __init__(self, cluster, run_id: str, logins: list[str]):
        self.cluster, self.run_id, self.logins = cluster, run_id, list(logins)
        self.group = None
        self.agents: dict[str, object] = {}
        self.ips: dict[str, str] = {}
        self._relay_head = b""
        self._python: dict[str, str] = {}

    # ---- connect: the placement group and its agents --------------------------------------
    def connect(self) -> list[Problem]:
        from ...spec.ray_rules import bundle
        if problem := connect(self.cluster.ray):
            return [problem]
        r, n, want = self.cluster.ray, len(self.logins), bundle(self.cluster)
        self.group = placement_group([dict(want) for _ in range(n)], strategy="STRICT_SPREAD",
                                     name=group_name(self.run_id))
        try:
            ray.get(self.group.ready(), timeout=r.placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self._remove_group()
            return [Problem("cluster.ray.nodes", f"{n}: Ray placed no {n} bundles of {want} on "
                            f"{n} different nodes within {r.placement_timeout_s:g}s ({fits(want)} "
                            "live nodes can hold one); ask fewer nodes, smaller "
                            "cluster.ray.resources, or a larger cluster")]
        remote = ray.remote(agent_module.NodeAgent)
        gpus, cpus = want.get("GPU", 0), want.get("CPU", 0)
        others = {k: v for k, v in want.items() if k not in ("GPU", "CPU")}
        for rank, login in enumerate(self.logins):
            self.agents[login] = remote.options(
                name=agent_name(self.run_id, rank), namespace=r.namespace, num_cpus=cpus,
                num_gpus=gpus, resources=others, max_concurrency=64,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, rank)).remote()
        try:
            where = ray.get([a.where.remote() for a in self.agents.values()],
                            timeout=r.placement_timeout_s)
            self._python = dict(zip(self.logins, ray.get(
                [a.python.remote() for a in self.agents.values()], timeout=CALL_SLACK_S)))
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as e:
            self.close()
            return [Problem("cluster.ray", f"the run's agents did not start on their bundles: {_why(e)}")]
        self.ips = {login: ip for login, (ip, _) in zip(self.logins, where)}
        return []

    def placed(self) -> list[str]:
        """One line per node: its bundle's Ray node."""
        return [f"node{rank} {login}: Ray node {self.ips.get(login, '?')}"
                for rank, login in enumerate(self.logins)]

    def lost_ips(self, result) -> list[str]:
        """The Ray nodes of this attempt's lost nodes (lost.py)."""
        return lost_ips(result, self.ips)

    @property
    def master_addr(self) -> str | None:
        """Bundle 0's Ray node IP once placed: every node's torchrun dials it."""
        return self.ips.get(self.logins[0]) if self.logins else None

    # ---- the Executor interface -------------------------------------------------------------
    def stage(self, plan: LaunchPlan) -> None:
        self._relay_head = render.relay_frame(relay_config(plan))
        targets = self.logins[:1] if plan.shared else self.logins
        script = stage_text(plan)
        calls = {h: self._call_run(h, script, 60) for h in targets}
        failed = []
        for h, ref in calls.items():
            code, out = self._result(ref, 60)
            if code != 0:
                lines = [ln for ln in out.splitlines() if ln.strip()] or [f"exit {code}"]
                failed.append(setup_failed(h, lines[-1]))
        if failed:
            raise UserError(failed)

    def start(self, node: NodePlan) -> "RayRunning":
        agent = self.agents[node.login]
        argv = [self._python[node.login], "-S", "-c", _relay(), "/bin/sh", "-c",
                render.bootstrap(merge_stderr=True)]
        head = self._relay_head or render.relay_frame({})
        key = f"{node.rank}.{os.getpid()}.{id(node)}"
        ray.get(agent.start.remote(key, argv, head + render.framed(node.script),
                                   {MASTER_VAR: self.master_addr}), timeout=CALL_SLACK_S)
        return RayRunning(agent, key, Spool(tempfile.gettempdir()))

    def run(self, host: str, script: str, timeout: float) -> tuple[int, str]:
        if host not in self.agents:
            return 255, f"{host} is no node of this run"
        return self._result(self._call_run(host, script, timeout), timeout)

    def drop_logs(self, dirs: dict[str, list[str]]) -> None:
        drop_logs_by_run(self.run, dirs)   # through each node's agent, still there

    def close(self) -> None:
        for a in self.agents.values():
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001  (gone already: a node lost, a second close)
                pass
        self.agents = {}
        self._remove_group()

    def _remove_group(self) -> None:
        if self.group is not None:
            try:
                remove_placement_group(self.group)
            except Exception:  # noqa: BLE001  (the cluster is gone: nothing is held)
                pass
            self.group = None

    def _call_run(self, host: str, script: str, timeout: float):
        return self.agents[host].run.remote(["/bin/sh", "-c", render.bootstrap()],
                                            render.framed(script), timeout, {MASTER_VAR: self.master_addr})

    def _result(self, ref, timeout: float) -> tuple[int, str]:
        try:
            return tuple(ray.get(ref, timeout=timeout + CALL_SLACK_S))
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as e:
            return LOST, f"ray: {_why(e)}"


class RayRunning:
    """One node's session through its agent (transport/base.py's Running): a thread takes its
    output from the agent into the spool and its relay lines into a queue."""

    def __init__(self, agent, key: str, spool: Spool):
        self.agent, self.key, self.spool = agent, key, spool
        self._err: queue.Queue[bytes] = queue.Queue()
        self._done = threading.Event()
        self._exit: Exit | None = None
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        try:
            while True:
                out, err, code = ray.get(self.agent.take.remote(self.key, TAKE_WAIT_S),
                                         timeout=TAKE_WAIT_S + CALL_SLACK_S)
                if out:
                    _write_all(self.spool.fd, out)
                if err:
                    self._err.put(err)
                if code is not None:
                    self._exit = Exit(code)
                    return
        except Exception as e:  # noqa: BLE001  (the actor died with its node, or the link broke)
            self._exit = Exit(LOST, lost=True, detail=f"ray: {_why(e)}")
        finally:
            self._done.set()
            self._err.put(b"")

    def ended(self) -> bool:
        return self._done.is_set()

    def read_err(self) -> bytes:
        return self._err.get()

    def wait(self, said: str | None = None) -> Exit:
        self._done.wait()
        return self._exit or Exit(LOST, lost=True, detail="no exit status")

    def heartbeat(self) -> None:
        if not self._done.is_set():
            self.agent.write.remote(self.key, b"x")

    def close(self) -> None:
        if not self._done.is_set():
            self.agent.hang_up.remote(self.key)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


@functools.cache
def _relay() -> str:
    return nodeprog.source("relay")

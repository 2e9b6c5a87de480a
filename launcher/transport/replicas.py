"""Checkpoints on hosts that share no disk (issue 54, `checkpoints: {replicas: N}`).

While an attempt runs, the Replicator asks every node what it holds (nodeprog/replicas.py
inventory) every checkpoints.poll_s; once a checkpoint is complete on a node (its ranks' last
files are written and node 0 wrote trainer_state.json) that node's part is copied to the next
N nodes (ring order), hash-checked, into output_dir/.mlaunch-replicas/checkpoint-N/part<R>,
and when every part has its copies one event (checkpoint_copies) and one line say where each
part is. Retention (passthrough.save_total_limit) is applied on every node.

Before a restart, assemble() finds the newest checkpoint complete across the copies the
reachable nodes hold, puts its parts together on node 0 and stages that whole checkpoint to
every node of the attempt (transport/staging.py), where each rank looks for it.
"""
from __future__ import annotations

import json
import posixpath
import threading
from concurrent.futures import ThreadPoolExecutor

from .. import nodeprog, render
from ..errors import UserError
from ..nodeprog.replicas import REPLICAS
from ..plan.launch_plan import LaunchPlan, remote_python
from ..plan.staging import Copy
from ..spec.hosts import login_addr
from ..spec.select import node_procs
from ..spec.staging import NODE, StageItem
from .staging import Item, copy_one, node_host, node_shell, stage_items

RUN_TIMEOUT_S = 120
GATHER_TIMEOUT_S = 6 * 3600


def _ranks(plan: LaunchPlan) -> list[list[int]]:
    """The global ranks of each node of plan, in node order."""
    procs, out, at = node_procs(plan.job.cluster), [], 0
    for n in procs[:len(plan.nodes)]:
        out.append(list(range(at, at + n)))
        at += n
    return out


def leftovers(plan: LaunchPlan, executor) -> frozenset[str]:
    """The checkpoint numbers any node of plan holds (its own, or a copy) before a fresh
    start: an earlier run's, which this run never resumes, copies or removes."""
    inv = _inventories(plan, executor)
    return frozenset(n for v in inv.values() for part in ("own", "replicas") for n in v[part])


def _without(inv: dict[str, dict], stale: frozenset[str]) -> dict[str, dict]:
    """inv less the checkpoints numbered in stale (an earlier run's, at a fresh start)."""
    if not stale:
        return inv
    return {login: {part: {n: e for n, e in v[part].items() if n not in stale} for part in ("own", "replicas")}
            for login, v in inv.items()}


def _inventories(plan: LaunchPlan, executor) -> dict[str, dict]:
    """{login: its inventory} of every node that answered (a lost node is left out)."""
    ranks, world, python = _ranks(plan), sum(map(len, _ranks(plan))), remote_python(plan.job)

    def one(i: int):
        node = plan.nodes[i]
        script = nodeprog.script(python, "replicas", ["inventory", plan.job.output_dir, json.dumps(ranks[i]), str(world)])
        code, out = executor.run(node.login, script, RUN_TIMEOUT_S)
        try:
            return node.login, json.loads(out.strip().splitlines()[-1]) if code == 0 else None
        except (ValueError, IndexError):
            return node.login, None
    with ThreadPoolExecutor(max_workers=min(32, len(plan.nodes))) as pool:
        return {k: v for k, v in pool.map(one, range(len(plan.nodes))) if v is not None}


class Replicator:
    """The copies of every node's checkpoint parts during one attempt (a thread)."""

    def __init__(self, plan: LaunchPlan, executor, say, events, saved_world: dict[str, int],
                 stale: frozenset[str] = frozenset()):
        self.plan, self.executor, self.say, self.events = plan, executor, say, events
        self.stale = stale                  # an earlier run's checkpoint numbers (leftovers()): never touched
        self.saved_world = saved_world      # checkpoint number -> the world that saved it (for assemble)
        self.copies = plan.job.checkpoints.replicas
        self.done: set[str] = set()         # checkpoint numbers whose every part has its copies
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="mlaunch-replicas")

    def start(self) -> "Replicator":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(RUN_TIMEOUT_S)

    def _loop(self) -> None:
        while not self._stop.wait(self.plan.job.checkpoints.poll_s):
            try:
                self.round()
            except Exception as e:   # a lost node, a copy cut by the teardown: the next round tries again
                if not self._stop.is_set():
                    self.say(f"checkpoint copies: {type(e).__name__}: {e}")

    def round(self) -> None:
        """One look at every node: copy each complete part its targets lack; record and say
        each checkpoint once all its parts have their copies; retention."""
        inv = _without(_inventories(self.plan, self.executor), self.stale)
        nodes = [n.login for n in self.plan.nodes]
        head = inv.get(nodes[0], {}).get("own", {})
        ranks = _ranks(self.plan)
        for num in sorted((k for k, v in head.items() if v["state"]), key=int):
            # the world that saved it: this attempt's, known once node 0's trainer_state.json is
            # there; a restart then needs every rank's part, even where the last node's is lost
            self.saved_world.setdefault(num, sum(map(len, ranks)))
            if num in self.done:
                continue
            todo, holders = [], {}
            for i, login in enumerate(nodes):
                mine = inv.get(login, {}).get("own", {}).get(num)
                if not mine or not mine["complete"]:
                    break
                part = ranks[i][0]
                holders[part] = [self.plan.nodes[i].host]
                for t in self._targets(i):
                    holders[part].append(self.plan.nodes[t].host)
                    if str(part) not in inv.get(nodes[t], {}).get("replicas", {}).get(num, {}):
                        todo.append((i, t, part))
            else:
                if self._copy_all(num, todo):
                    self._record(num, holders)
        self._retain(inv)

    def _targets(self, i: int) -> list[int]:
        n = len(self.plan.nodes)
        return [(i + k) % n for k in range(1, min(self.copies, n - 1) + 1)]

    def _copy_all(self, num: str, todo: list[tuple[int, int, int]]) -> bool:
        """Each (node, target, part) copy; True when all succeeded."""
        def one(job):
            i, t, part = job
            return self._copy(num, i, t, part)
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(todo)))) as pool:
            return all(pool.map(one, todo))

    def _copy(self, num: str, i: int, t: int, part: int) -> bool:
        out, src, dst = self.plan.job.output_dir, self.plan.nodes[i], self.plan.nodes[t]
        path = posixpath.join(out, f"checkpoint-{num}")
        code, text = self.executor.run(src.login, nodeprog.script(
            remote_python(self.plan.job), "manifest", ["manifest", path]), RUN_TIMEOUT_S)
        if code != 0:
            return False
        item = Item(0, StageItem(src=NODE + path, dst=posixpath.join(out, REPLICAS, f"checkpoint-{num}", f"part{part}")),
                    source=json.loads(text.strip().splitlines()[-1]), holder=src.login,
                    nodes={dst.login: {"state": "absent"}})
        return copy_one(self.plan, self.executor, item, Copy(src.login, dst.login)) is None

    def _record(self, num: str, holders: dict[int, list[str]]) -> None:
        self.done.add(num)
        self.saved_world[num] = sum(map(len, _ranks(self.plan)))
        where = "; ".join(f"part{p} on {', '.join(h)}" for p, h in sorted(holders.items()))
        self.events.emit("checkpoint_copies", checkpoint=f"checkpoint-{num}", replicas=self.copies,
                         parts={str(p): h for p, h in holders.items()})
        self.say(f"checkpoint-{num}: every node's part on {self.copies} other node(s): {where}")

    def _retain(self, inv: dict[str, dict]) -> None:
        """passthrough.save_total_limit on every node: the newest L checkpoints complete across
        copies, and every newer one (being saved), are kept."""
        limit = self.plan.job.passthrough.get("save_total_limit") if hasattr(self.plan.job, "passthrough") else None
        if not limit or not self.done:
            return
        done = sorted(self.done, key=int)
        keep = set(done[-int(limit):]) | {k for v in inv.values() for k in v["own"] if int(k) > int(done[-1])}
        gone = set()
        for node in self.plan.nodes:
            if node.login not in inv:
                continue
            held = set(inv[node.login]["own"]) | set(inv[node.login]["replicas"])
            if held - keep:
                script = nodeprog.script(remote_python(self.plan.job), "replicas",   # never an earlier run's
                                         ["prune", self.plan.job.output_dir, json.dumps(sorted(keep | self.stale, key=int))])
                self.executor.run(node.login, script, RUN_TIMEOUT_S)
                gone |= held - keep
        self.done &= keep


def set_aside(plan: LaunchPlan, executor, tag: str, resume_from: str | None) -> dict[str, dict]:
    """On every machine of plan (once, where two nodes share one: one disk), its own
    checkpoint-N folders and its copies of other nodes' parts above resume_from's step moved
    into output_dir/mlaunch-set-aside/tag (launcher/nodeprog/setaside.py); {login: what it did}
    ({"error": ...} where it could not). A machine is its name (case and loopback aside) and
    its sshd's port: `n1` and `n1:22` are one disk, `n1:2222` and `n1:2223` two (containers)."""
    args = [plan.job.output_dir, tag, "--also", REPLICAS] + (["--resume", resume_from] if resume_from else [])
    script = nodeprog.script(remote_python(plan.job), "setaside", args)
    machines: dict[tuple[str, int], str] = {}   # the first login of each machine
    for n in plan.nodes:
        machines.setdefault(login_addr(n.login).key(plan.job.cluster.ssh.port), n.login)

    def one(login):
        code, out = executor.run(login, script, RUN_TIMEOUT_S)
        try:
            got = json.loads(out.strip().splitlines()[-1]) if code == 0 else None
        except (ValueError, IndexError):
            got = None
        return login, got if isinstance(got, dict) else {"moved": [], "error": f"exit {code}: {out.strip()[-200:]}"}
    logins = list(machines.values())
    with ThreadPoolExecutor(max_workers=min(32, len(logins))) as pool:
        return dict(pool.map(one, logins))


def assemble(plan: LaunchPlan, executor, say, saved_world: dict[str, int],
             stale: frozenset[str] = frozenset()) -> str | None:
    """The newest checkpoint complete across the copies the nodes of plan hold, put together on
    node 0 and staged to every node of plan; its path, or None (no checkpoint is complete).
    stale: an earlier run's checkpoint numbers, never taken (leftovers())."""
    inv = _without(_inventories(plan, executor), stale)
    lost = [n.host for n in plan.nodes if n.login not in inv]
    if lost:
        raise UserError(f"checkpoints: cannot ask {', '.join(lost)} what they hold; nothing was started")
    where: dict[str, dict[int, tuple[str, str]]] = {}   # N -> rank -> (login, path of the files)
    state: set[str] = set()
    out = plan.job.output_dir
    for login, v in inv.items():
        for num, mine in v["own"].items():
            for r in mine["ranks"] or ([0] if mine["state"] else []):
                where.setdefault(num, {}).setdefault(r, (login, posixpath.join(out, f"checkpoint-{num}")))
            if mine["state"]:
                state.add(num)
        for num, parts in v["replicas"].items():
            for part, ranks in parts.items():
                path = posixpath.join(out, REPLICAS, f"checkpoint-{num}", f"part{part}")
                for r in ranks:
                    where.setdefault(num, {}).setdefault(r, (login, path))
                if int(part) == 0:
                    state.add(num)
    for num in sorted(where, key=int, reverse=True):
        world = saved_world.get(num, max(where[num]) + 1)
        if num in state and all(r in where[num] for r in range(world)):
            return _put_together(plan, executor, say, num, where[num], world)
    return None


def _put_together(plan, executor, say, num: str, parts: dict[int, tuple[str, str]], world: int) -> str:
    """Every part of checkpoint-num merged into node 0's checkpoint-num (what it has stays),
    rank 0's part first; then node 0's whole checkpoint staged to every node of plan."""
    head, ckpt = plan.nodes[0], posixpath.join(plan.job.output_dir, f"checkpoint-{num}")
    sources = sorted({v for v in parts.values()}, key=lambda v: (v != parts.get(0), v))
    for login, path in sources:
        if login == head.login and path == ckpt:
            continue
        script = render.staging_pull_script(link_dest=None, parent=posixpath.dirname(ckpt),
                                            shell=node_shell(plan, login), merge=True,
                                            host=None if login == head.login else node_host(login),
                                            src=path + "/", tmp=ckpt + "/", tmp_name=None)   # merged into the checkpoint itself
        code, text = executor.run(head.login, script, GATHER_TIMEOUT_S)
        if code != 0:
            raise UserError(f"checkpoints: node0 {head.host} could not fetch a part of {ckpt} "
                            f"from {login}: {text.strip().splitlines()[-1] if text.strip() else code}")
    froms = sorted({login for login, _ in parts.values()})
    say(f"checkpoint-{num}: complete across copies (world {world}); put together on node0 {head.host} "
        f"from {', '.join(froms)}")
    spread(plan, executor, say, ckpt)
    return ckpt


def spread(plan: LaunchPlan, executor, say, ckpt: str) -> None:
    """node 0's checkpoint staged to every node of plan (node to node, manifest-checked)."""
    stage_items(plan, executor, [Item(0, StageItem(src=NODE + ckpt, dst=ckpt), label="checkpoint")], say)

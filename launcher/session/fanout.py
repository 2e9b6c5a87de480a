"""`mlaunch exec`: one command on every node at once, streamed with node prefixes.

The transport is the job's backend's (launcher/backends: its control()); the
script comes from templates/exec.sh.j2 (render.exec_script). Nothing is staged."""
from __future__ import annotations

import dataclasses
import threading

from .. import render
from ..plan.launch_plan import LaunchPlan, NodePlan, remote_bin
from ..transport.base import LOST, Exit
from ..logs.stream import LineSplitter, Printer

_TAGS = ("MLAUNCH_RUN_ID", "MLAUNCH_NODE_RANK", "MLAUNCH_NODE_ID", "CUDA_VISIBLE_DEVICES")


def exec_nodes(plan: LaunchPlan, argv: list[str], guard: bool = True) -> list[NodePlan]:
    """Each node of plan with exec's script in place of the job's (guard: keep the node's
    hang-up guard; a scheduler's backend ends its own steps)."""
    out = []
    for n in plan.nodes:
        env = [(k, v) for k, v in n.env if k not in _TAGS and isinstance(v, str)]
        script = render.exec_script(n.rank, n.host, argv, env, remote_bin(plan.job), n.workdir,
                                    guard=guard)
        out.append(dataclasses.replace(n, script=script, display=plan.mask(script)))
    return out


def run_everywhere(nodes: list[NodePlan], executor, printer: Printer) -> list[Exit]:
    """Start every node's command, stream its lines with the node prefix, and return each
    node's Exit in rank order (a session that fails to start counts as lost)."""
    exits: list[Exit | None] = [None] * len(nodes)

    def one(i: int, node: NodePlan) -> None:
        try:
            running = executor.start(node)
        except Exception as e:  # noqa: BLE001  (one node's failure must not hide the others')
            exits[i] = Exit(LOST, lost=True, detail=f"could not start: {e}")
            return
        split = LineSplitter()
        said = threading.Thread(target=_drain_err, args=(running,), daemon=True)
        said.start()
        try:
            for data in _output(running):
                if lines := split.feed(data):
                    printer.node_lines(node.rank, node.host, lines)
            if rest := split.flush():
                printer.node_lines(node.rank, node.host, rest)
            said.join()
            exits[i] = running.wait()
        finally:
            running.close()

    threads = [threading.Thread(target=one, args=(i, n), daemon=True) for i, n in enumerate(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)   # short joins: Ctrl-C reaches the main thread
    return [e or Exit(LOST, lost=True, detail="no exit status") for e in exits]


def _output(running):
    """The node's output as it comes: its spool, polled until the session has ended and all
    it wrote was taken (exec's output is short: read here, not moved into a node log)."""
    while True:
        ended = running.ended()   # before the take: what it wrote is in the spool then
        data = running.spool.take()
        if data:
            yield data
        elif ended:
            return
        running.spool.pause(bool(data))


def _drain_err(running) -> None:
    """The session's stderr (the relay's lines; exec reads none of them) to its end."""
    while running.read_err():
        pass


def exit_table(nodes: list[NodePlan], exits: list[Exit]) -> list[str]:
    """One row per node: rank, host, exit status (or how it was lost)."""
    width = max(len(n.host) for n in nodes)
    rows = [f"{'node':<5} {'host':<{width}} exit"]
    for n, e in zip(nodes, exits):
        what = f"lost ({e.detail})" if e.lost else str(e.code)
        rows.append(f"{n.rank:<5} {n.host:<{width}} {what}")
    return rows

"""Spare hosts as the ssh config sees them, at submit and in `mlaunch check` (issue 50): the
ssh backend's probe_spares hook (a scheduler's backend has no spare hosts).

A spare must be a machine the job does not use, and the spec's names can hide one: `n1x` in
~/.ssh/config (or cluster.ssh.config_file) may be node 1 under another name, and two nodes
then run on one machine, each taking every GPU. So every node and spare is resolved as the
stream client will reach it (`ssh -G`: hostname, port, proxy), and a directly reached name
through DNS too; a spare on the machine of a node or of an earlier spare is refused before
anything connects. validate and the dry run stay with the spec's names (spare_rules.py):
they read no machine's ssh config.

Each spare is then logged in to once, beside the job's own connect and without holding it
up: one that fails is a warning line and a `spare_unreachable` event, never a refusal (the
job does not need it; a restart that does skips it while it stays so, runs/spares.py).
"""
from __future__ import annotations

import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor, wait

from ...errors import Problem, UserError
from ...transport import ssh_probe
from ...plan.launch_plan import LaunchPlan
from ...record.events import EventLog
from ...spec.hosts import machine_key

DNS_WAIT_S = 2.0   # names DNS has not answered by then are compared by name only


class Probe:
    """The spares' logins, under way in a thread of their own; once all have ended, each
    failure goes to on_failed(spare, cause)."""

    def __init__(self, plan: LaunchPlan, resolved: dict, on_failed=None):
        self._failed: dict[str, str] = {}
        self._on_failed = on_failed
        spares = plan.job.cluster.spare_hosts
        known = {h: resolved[h].known for h in spares if h in resolved}
        self._thread = threading.Thread(target=self._run, args=(plan.job.cluster.ssh, spares, known),
                                        name="mlaunch-spare-probe", daemon=True)
        self._thread.start()

    def wait(self) -> dict[str, str]:
        """Once every login has ended: ssh's cause for each spare that failed, by spare."""
        self._thread.join()
        return dict(self._failed)

    def _run(self, ssh, spares: list[str], known: dict) -> None:
        try:
            said = ssh_probe.login(ssh, spares, known)
        except OSError:   # no temporary directory, no process to start: the job's connect says so
            return
        for spare, cause in said.items():
            if cause is not None:
                self._failed[spare] = cause
                if self._on_failed is not None:
                    self._on_failed(spare, cause)


def at_submit(plan: LaunchPlan, printer) -> Probe | None:
    """submit's: refuse a spare that is a node (or another spare) under another name, then log
    in to every spare while the job connects and starts; each failure is one warning line and
    a `spare_unreachable` event once the logins have ended (within cluster.ssh.connect_timeout
    and ssh_probe.LOGIN_SLACK_S), holding nothing up."""
    return begin(plan, lambda spare, cause: _report(plan, printer, spare, cause))


def begin(plan: LaunchPlan, on_failed=None) -> Probe | None:
    """The refusal (UserError), then the spares' Probe; None where there is nothing to do
    (no spares, a scheduler's nodes, no `ssh` to ask)."""
    c = plan.job.cluster
    if not c.spare_hosts or c.scheduler != "ssh" or not ssh_probe.available():
        return None
    nodes = [n.login for n in plan.nodes]
    resolved = ssh_probe.resolve(c.ssh, [*nodes, *c.spare_hosts])
    if problems := same_machines(plan, resolved, _addresses(resolved)):
        raise UserError(problems)
    return Probe(plan, resolved, on_failed)


def warning(spare: str, cause: str) -> str:
    """The one line for a spare that failed its login."""
    return (f"spare host {spare} cannot be reached: {cause}; a restart that needs a spare skips "
            "it while it stays so: fix its network, sshd or key, or remove it from "
            "cluster.spare_hosts")


def same_machines(plan: LaunchPlan, resolved: dict, addresses: dict) -> list[Problem]:
    """A line for each spare whose machine is a node's or an earlier spare's: the names, the
    machine both resolve to, the fix. resolved: ssh_probe.Resolved by login; addresses: the
    IP addresses DNS gave each directly reached login."""
    taken: list[tuple[str, str, set]] = []   # (what it is, its name, its machine keys)
    for n in plan.nodes:
        taken.append((f"node {n.rank}", n.login, _keys(n.login, resolved, addresses)))
    problems = []
    for i, spare in enumerate(plan.job.cluster.spare_hosts):
        keys = _keys(spare, resolved, addresses)
        hit = next(((what, name, keys & other) for what, name, other in taken if keys & other), None)
        if hit:
            what, name, shared = hit
            fix = "list each spare machine once" if what.startswith("cluster") else \
                "a spare must be a machine the job does not use: remove it or name another"
            problems.append(Problem(f"cluster.spare_hosts[{i}]", (
                f"{spare!r} is {what} ({name!r}) under another name: both resolve to "
                f"{_machine(min(shared, key=lambda k: k[0] != 'name'))}; {fix}")))
        taken.append((f"cluster.spare_hosts[{i}]", spare, keys))
    return problems


def _keys(login: str, resolved: dict, addresses: dict) -> set:
    """What identifies login's machine: (hostname, port, proxy) as ssh resolves it, and
    (address, port) for each address DNS gave it."""
    r = resolved.get(login)
    if r is None:
        return set()
    return {("name", machine_key(r.hostname), r.port, r.via),
            *(("address", machine_key(ip), r.port, "") for ip in addresses.get(login, ()))}


def _machine(key: tuple) -> str:
    """A machine key as words: where, and what said so."""
    kind, where, port, via = key
    if kind == "address":
        return f"{where} port {port} through DNS"
    return f"{where} port {port}" + (f" behind {via}" if via else "") + " through the ssh config"


def _addresses(resolved: dict) -> dict[str, set[str]]:
    """The IP addresses of each directly reached login's hostname (getaddrinfo, in parallel):
    a name behind a jump host or proxy means what it means there, not here. A name DNS has
    not answered within DNS_WAIT_S gets none."""
    direct = {h: r for h, r in resolved.items() if not r.via}
    pool = ThreadPoolExecutor(max_workers=min(16, len(direct) or 1))
    jobs = {h: pool.submit(_lookup, r.hostname, r.port) for h, r in direct.items()}
    wait(jobs.values(), timeout=DNS_WAIT_S)
    pool.shutdown(wait=False, cancel_futures=True)
    return {h: j.result() for h, j in jobs.items() if j.done() and not j.cancelled()}


def _lookup(hostname: str, port: int) -> set[str]:
    try:
        infos = socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return set()
    return {info[4][0] for info in infos}


def _report(plan: LaunchPlan, printer, spare: str, cause: str) -> None:
    """A failed spare's warning line and event (from the probe's thread); nothing once the
    run has ended (a run shorter than the login's timeout): it no longer needs spares, and
    run_end stays the last event."""
    path = os.path.join(plan.log_dir, "events.jsonl")
    if _ended(path):
        return
    try:
        printer.say(warning(spare, cause))
    except (OSError, ValueError):   # the console log was closed meanwhile: the run ended
        return
    EventLog(path, plan.run_id).emit("spare_unreachable", host=spare, cause=cause)


def _ended(path: str) -> bool:
    """Whether the events file's last line is the run's run_end."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            tail = f.read().splitlines()
    except OSError:
        return False
    return bool(tail) and b'"event": "run_end"' in tail[-1]

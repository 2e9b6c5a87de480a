"""Where the user's ssh config sends a host, and whether the host lets mlaunch log in.

resolve() asks the OpenSSH client itself (`ssh -G`, templates/ssh_resolve.j2): it applies
the config (Host aliases, HostName, Port, ProxyJump, Match) exactly as a node's stream client
will, and connects nowhere. login() is one login through the stream client's own options
(transport/openssh.py: the same config file, key, known_hosts policy, jump host and
ConnectTimeout) that runs `true`; what ssh said is the cause when it fails. Spare hosts use
both at submit and in `mlaunch check` (backends/ssh/spares.py); only backends run ssh.
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .. import render
from ..spec import SSH
from .openssh import OpenSSHStreams
from .openssh_running import ACCEPTED
from ..spec.hosts import login_addr

RESOLVE_TIMEOUT_S = 10.0   # `ssh -G` reads files only; a config that runs a slow `Match exec` is cut off
LOGIN_SLACK_S = 10.0   # past ConnectTimeout, the login's own limit (as OpenSSHStreams.await_ready's)


@dataclass(frozen=True)
class Resolved:
    """Where ssh goes for one login: the machine (hostname, port), the jump host or proxy it
    goes through ("" when direct), and the known_hosts files the config names for it."""

    hostname: str
    port: int
    via: str
    known: tuple[str, ...]


def available() -> bool:
    """Whether the OpenSSH client is installed (without it there is nothing to ask)."""
    return shutil.which("ssh") is not None


def resolve(ssh: SSH, logins: list[str]) -> dict[str, Resolved]:
    """Each login's Resolved, asked in parallel; a login whose config ssh cannot read is left
    out (its own connect says why)."""
    logins = list(dict.fromkeys(logins))
    with ThreadPoolExecutor(max_workers=min(32, len(logins) or 1)) as pool:
        found = dict(zip(logins, pool.map(lambda h: _resolve_one(ssh, h), logins)))
    return {h: r for h, r in found.items() if r is not None}


def login(ssh: SSH, logins: list[str], known: dict[str, tuple[str, ...]]) -> dict[str, str | None]:
    """Log in to each login at once and run `true`: by login, ssh's own words when it failed
    (e.g. "ssh: connect to host 10.0.0.5 port 22: No route to host"), None when it got in.
    known: the config's known_hosts files per login (Resolved.known), read where
    cluster.ssh.known_hosts is not given, as the node's stream client reads them."""
    streams = OpenSSHStreams(ssh)
    atexit.register(streams.close)   # a launcher that ends first leaves no private directory
    try:
        jump = _jump(ssh)
        for h in logins:
            addr = login_addr(h)
            streams.add(h, addr, _port(ssh, h), _known_files(ssh, known.get(h, ())), jump)
        limit = ssh.connect_timeout + LOGIN_SLACK_S
        with ThreadPoolExecutor(max_workers=min(32, len(logins) or 1)) as pool:
            said = dict(zip(logins, pool.map(lambda h: streams.run(h, "true", b"", limit), logins)))
        return {h: _cause(code, text) for h, (code, text) in said.items()}
    finally:
        atexit.unregister(streams.close)
        streams.close()


def _resolve_one(ssh: SSH, login: str) -> Resolved | None:
    addr = login_addr(login)
    argv = render.argv_lines(
        "ssh_resolve.j2", config_file=os.path.expanduser(ssh.config_file) if ssh.config_file else None,
        user=addr.user or ssh.user, port=_port(ssh, login), host=addr.name)
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=RESOLVE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    conf: dict[str, str] = {}
    for line in r.stdout.splitlines():
        key, _, value = line.partition(" ")
        conf.setdefault(key.lower(), value.strip())
    if not conf.get("hostname") or not conf.get("port", "").isdigit():
        return None
    via = ssh.jump_host or next((conf[k] for k in ("proxyjump", "proxycommand")
                                 if conf.get(k, "none") != "none"), "")
    return Resolved(conf["hostname"], int(conf["port"]), via,
                    tuple(conf.get("userknownhostsfile", "").split()))


def _port(ssh: SSH, login: str) -> int | None:
    """The port the stream client is given (the login's, else a cluster.ssh.port the spec
    sets); None lets the config decide, as it does for that client."""
    return login_addr(login).port or (ssh.port if "port" in ssh.model_fields_set else None)


def _jump(ssh: SSH):
    """The stream client's jump host and its known_hosts files, or None."""
    if not ssh.jump_host:
        return None
    found = resolve(ssh, [ssh.jump_host]).get(ssh.jump_host)
    return login_addr(ssh.jump_host), _known_files(ssh, found.known if found else ())


def _known_files(ssh: SSH, configured: tuple[str, ...]) -> list[str]:
    """cluster.ssh.known_hosts, else the config's files, else ~/.ssh/known_hosts (the files
    SSHExecutor gives a node's stream client)."""
    files = [ssh.known_hosts] if ssh.known_hosts else list(configured)
    return [os.path.expanduser(f) for f in files or ["~/.ssh/known_hosts"]]


def _cause(code: int, text: str) -> str | None:
    """None for a login that ran `true`; else ssh's last words (or the exit code)."""
    if code == 0:
        return None
    words = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(ACCEPTED)]
    return words[-1] if words else f"exit {code}"


"""Host strings as ssh and pdsh take them, and DeepSpeed/OpenMPI hostfile lines.

A host string is `host`, `user@host`, `host:port`, `user@host:port`, `[v6addr]:port` or a bare
IPv6 address. The user and port are SSH's business only: torchrun's --master-addr, preflight
and the logs see the host name alone.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from ..errors import Problem

NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}$")
USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
LOOPBACK = re.compile(r"^(localhost|127\.\d+\.\d+\.\d+|::1)$", re.I)
_EQ = re.compile(r"\s*=\s*")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
FORMS = "give host, user@host, host:port, user@host:port or [v6addr]:port"


@dataclass(frozen=True)
class HostAddr:
    """One parsed host string: the name every tool dials, and SSH's user and port if given."""

    name: str
    user: str | None = None
    port: int | None = None

    @property
    def login(self) -> str:
        """The canonical SSH destination, `[user@]name[:port]` (IPv6 bracketed with a port)."""
        name = f"[{self.name}]" if self.port is not None and ":" in self.name else self.name
        return (f"{self.user}@" if self.user else "") + name + (f":{self.port}" if self.port else "")

    def key(self, default_port: int) -> tuple[str, int]:
        """Node identity: DNS and SSH ignore case; another port is another sshd (a container)."""
        return machine_key(self.name), self.port or default_port


def machine_key(name: str) -> str:
    """Names that are surely one machine share a key: case is ignored, every loopback is this one."""
    return "localhost" if LOOPBACK.fullmatch(name) else name.lower()


def is_address(name: str) -> bool:
    """A host name or an IP address: what torchrun's --master-addr and a TCP dial accept."""
    if NAME_RE.fullmatch(name) and ".." not in name:
        return True
    try:
        ipaddress.IPv6Address(name)
        return True
    except ValueError:
        return False


def parse_host(text: str) -> HostAddr | str:
    """The parsed host string, or why it is not one (a message without the field name)."""
    user, at, rest = text.rpartition("@")
    if at and not USER_RE.fullmatch(user):
        return f"{text!r}: {user!r} is not a user name; {FORMS}"
    port = None
    m = re.fullmatch(r"\[([^\]]*)\](?::([^:]*))?", rest)
    if m:
        name, port_text = m.group(1), m.group(2)
        if ":" not in name or not is_address(name):
            return f"{text!r}: [{name}] is not an IPv6 address; {FORMS}"
    elif rest.count(":") == 1:
        name, port_text = rest.split(":")
    else:
        name, port_text = rest, None
    if port_text is not None:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            return f"{text!r}: port {port_text!r} is not 1-65535; {FORMS}"
        port = int(port_text)
    if not name or not is_address(name):
        return f"{text!r} is not a host name or address; {FORMS}"
    return HostAddr(name, user or None, port)


def host_addrs(hosts: list[str]) -> list[HostAddr]:
    """Parsed host strings of a validated cluster (an invalid one is kept whole as the name)."""
    out = []
    for h in hosts:
        a = parse_host(h)
        out.append(a if isinstance(a, HostAddr) else HostAddr(h))
    return out


def check_hosts(hosts: list[str], ssh_user: str | None, ssh_port: int | None) -> list[Problem]:
    """Every host string parses, and its user/port agree with cluster.ssh where both are set."""
    p: list[Problem] = []
    for i, h in enumerate(hosts):
        a = parse_host(h)
        where = f"cluster.hosts[{i}]"
        if isinstance(a, str):
            p.append(Problem(where, a))
            continue
        if a.user and ssh_user and a.user != ssh_user:
            p.append(Problem(where, f"{h!r} says user {a.user} but cluster.ssh.user is {ssh_user}; "
                             "remove one (per-host users need cluster.ssh.user unset)"))
        if a.port and ssh_port and a.port != ssh_port:
            p.append(Problem(where, f"{h!r} says port {a.port} but cluster.ssh.port is {ssh_port}; "
                             "remove one (per-host ports need cluster.ssh.port unset)"))
    return p


def parse_hostfile(text: str, name: str, shown: str | None = None
                   ) -> tuple[list[str], list[int | None], list[Problem], list[str]]:
    """DeepSpeed/OpenMPI hostfile lines `host [slots=N] [key=value ...]`, # comments, blank lines.

    Returns hosts, slots (None where a line has none), problems (named `name:line`) and
    notes (naming `shown`, the path as the spec gives it): keys other than slots (OpenMPI's
    max_slots, ...) are read past, and the notes say which, once per key.
    """
    hosts, slots, problems = [], [], []
    ignored: dict[str, list[int]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = _EQ.sub("=", line.split("#", 1)[0].strip())
        if not line:
            continue
        host, *rest = line.split()
        count, bad = None, None
        for token in rest:
            key, eq, value = token.partition("=")
            if key == "slots" and value.isdigit():
                count = int(value)
            elif not eq or not _KEY.fullmatch(key) or key == "slots":
                bad = token
            elif _slots_typo(key):   # DeepSpeed refuses the line: read past, 2 x 8 would run as ...
                problems.append(Problem(f"{name}:{n}", f"{token!r}: did you mean slots={value}? "
                                        "(DeepSpeed and OpenMPI read only `slots=`, lower case)"))
                bad = ""
            else:
                ignored.setdefault(key, []).append(n)
        if bad == "":
            continue
        if bad is not None or "=" in host:
            problems.append(Problem(f"{name}:{n}", f"expected `host slots=N`, got {line!r}"))
            continue
        if count == 0:
            problems.append(Problem(f"{name}:{n}", f"{host} slots=0: a node runs at least one "
                                    "process; remove the line or exclude the host"))
            continue
        hosts.append(host)
        slots.append(count)
    notes = [f"{shown or name}: {key}= ignored on {_lines(ns)}; mlaunch reads only slots="
             for key, ns in ignored.items()]
    return hosts, slots, problems, notes


def _slots_typo(key: str) -> bool:
    """`slot=4`, `SLOTS=2`, `Slots=8`, `slost=2`: slots= misspelt (OpenMPI's max_slots is not)."""
    import difflib
    k = key.lower()
    return not k.startswith("max") and (k.startswith("slot") or
                                         difflib.SequenceMatcher(None, k, "slots").ratio() >= 0.8)


def _lines(ns: list[int]) -> str:
    head = ", ".join(map(str, ns[:5]))
    return f"line {head}" if len(ns) == 1 else f"lines {head}" + (f" … ({len(ns)} lines)" if len(ns) > 5 else "")


def login_addr(login: str) -> HostAddr:
    """The address of a login ([user@]host[:port]); a name parse_host does not take stays whole."""
    a = parse_host(login)
    return a if isinstance(a, HostAddr) else HostAddr(login)

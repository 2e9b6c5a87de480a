"""paramiko's side of the SSH executor: its transport's settings, and the one line that
explains why a login failed (transport/ssh.py asks paramiko where the OpenSSH client could not
log in)."""
from __future__ import annotations

import errno
import inspect
import logging
import os
import socket

import paramiko

from ..spec import SSH
from ..spec.hosts import HostAddr, login_addr
from .openssh import NO_SSHD, refused_line, unreached_fix

# paramiko logs a transport's failure as a traceback at ERROR (a host that never sent its
# banner: 20 lines); with no handler, Python's last resort prints it to the console. Every
# failure becomes one line here (explain_connect_error, Exit.detail): its logger prints nothing.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

KEEPALIVE_S = 2        # an SSH keepalive every 2 s of silence ...
TCP_USER_TIMEOUT_MS = 6000  # ... unacknowledged for 6 s means the link is gone
# Asked for first: an AEAD cipher spares paramiko an HMAC and its compare in Python on every
# packet (much of its CPU per MB of node output, bench/results/logpath-*); a server
# without them settles on the next cipher in paramiko's own order, as before.
AEAD_FIRST = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def aead_first_transport(sock, **kw) -> paramiko.Transport:
    """A paramiko Transport that offers AEAD_FIRST ahead of its other ciphers (those it knows)."""
    transport = paramiko.Transport(sock, **kw)
    opts = transport.get_security_options()
    first = tuple(c for c in AEAD_FIRST if c in opts.ciphers)
    opts.ciphers = first + tuple(c for c in opts.ciphers if c not in first)
    return transport


TAKES_FACTORY = "transport_factory" in inspect.signature(paramiko.SSHClient.connect).parameters


def explain_connect_error(e: Exception, addr: HostAddr | str, ssh: SSH) -> str:
    """One line: what went wrong reaching host, and the command or setting that fixes it."""
    addr = login_addr(addr) if isinstance(addr, str) else addr
    host, port, user = addr.name, addr.port or ssh.port, addr.user or ssh.user
    known = host if port == 22 else f"'[{host}]:{port}'"  # known_hosts' name for another port
    if isinstance(e, paramiko.BadHostKeyException):
        return (f"host key CHANGED (got {e.key.get_name()} {e.key.fingerprint}); if the host was "
                f"reinstalled, verify it and run: ssh-keygen -R {known}")
    if isinstance(e, paramiko.SSHException) and "not found in known_hosts" in str(e):
        where = ssh.known_hosts or "~/.ssh/known_hosts"
        return (f"host key unknown and strict_host_keys is on; verify the fingerprint, then run: "
                f"ssh-keyscan -p {port} {host} >> {where}")
    if isinstance(e, paramiko.AuthenticationException):
        return (f"authentication failed for user {user or os.environ.get('USER', '?')}; check "
                "cluster.ssh.key_file / cluster.ssh.user or load the key into ssh-agent")
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
        return _no_connection(e, port)
    if isinstance(e, paramiko.SSHException) and ("banner" in str(e) or "No existing session" in str(e)):
        # "No existing session": the handshake had not finished when connect's timeout ran out
        return f"no SSH handshake in {ssh.connect_timeout:g}s (paramiko: {e}); {NO_SSHD}"
    if isinstance(e, (socket.timeout, TimeoutError)):
        return f"no answer within {ssh.connect_timeout:g}s: host down, or port {port} firewalled?"
    if isinstance(e, socket.gaierror):
        return f"cannot resolve host name: {e.strerror}"
    return f"cannot connect: {type(e).__name__}: {e}"


def _no_connection(e: paramiko.ssh_exception.NoValidConnectionsError, port: int) -> str:
    """The line for a host no address of which took the connection, with the system's own
    words (a refusal is not a missing route)."""
    codes = {getattr(err, "errno", None) for err in e.errors.values()}
    if codes == {errno.ECONNREFUSED}:
        return refused_line(port)
    said = next((os.strerror(c) for c in codes if c), str(e))
    route = codes & {errno.EHOSTUNREACH, errno.ENETUNREACH}
    return f"{said} on port {port}; {unreached_fix('No route to host' if route else '', port, 0)}"


def set_user_timeout(sock: object) -> None:
    # Makes a dead link (no ACKs) fail the socket, hence the transport, within seconds.
    if isinstance(sock, socket.socket) and hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, TCP_USER_TIMEOUT_MS)

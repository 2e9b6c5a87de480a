"""Real multi-host test fixture built from Linux network namespaces.

Each "host" is a named network namespace attached to a private Linux bridge,
with its own IPv4 address, its own hostname, its own processes and its own
OpenSSH ``sshd``: a separate machine as far as its programs can tell.  Everything stays on this machine: the
namespaces only have a route for their /24, and the root namespace reaches
them through the bridge address (no ip_forward, no NAT, no firewall edits).

Layout for a HostSet with tag ``<tag>`` (1-6 chars of [a-z0-9]):

* bridge            ``mlhb-<tag>``            gateway 10.213.<k>.1/24
* host i namespace  ``mlh-<tag>-<i>``         (also its hostname)
* host i veth       ``mlhv-<tag>-<i>`` (root side, on the bridge) <-> ``eth0``
* host i IP         10.213.<k>.<11+i>
* /etc/netns/mlh-<tag>-<i>/hosts  (bind-mounted over /etc/hosts by
  ``ip netns exec``: every host name -> its real IP)
* temp dir          ``$TMPDIR/mlh-<tag>-XXXXXXXX`` (keys, configs, logs)
* registry record   ``/run/mlh-hosts/<tag>.json`` (owner pid + start time),
  used to find and remove resources left behind by a crashed run.

PID namespaces: each host has a PID 1 of its own (``mlh-init``: ``sleep infinity``
with SIGCHLD ignored, so it reaps every orphan), started by ``ip netns exec <ns>
unshare --uts --pid --fork --mount-proc``: a PID namespace, a UTS namespace with the
hostname, and a mount namespace (below the one ``ip netns exec`` made, /etc/netns/<ns>/
over /etc) with /proc mounted for that PID namespace. sshd and every Host.run/popen
command join all four (born in the PID namespace, see namespaces.popen_in_pidns, then
``nsenter --net --mount --uts``), so a host's ps, /proc, pkill and kill -1 see only that
host's processes, as on a real machine. sshd is not PID 1 (stop_sshd leaves its sessions
running; they are re-parented to mlh-init); killing mlh-init ends the whole host at once
(HostSet.close does). Host.pids() lists a host's processes by their PIDs in the root
namespace (network namespace or PID namespace membership), without mlh-init and the
``unshare`` that holds it (Host.machine_pids()); Host.inner_pid(pid) is the PID the host
itself shows.

ssh sessions log in as root with root's real home (/root, so root's
~/.bashrc runs: ~0.3 s per session here because it runs `pyenv init`), or,
with make_hosts(..., isolated_home=True), with an empty per-host home
(/etc/netns/<ns>/passwd overlay) and sshd's default PATH.

``k`` is chosen under an exclusive flock so two HostSets (in one process or
in concurrent pytest runs) never share a subnet: the first 10.213.k.0/24 that
overlaps no address or route of the root namespace and no live registry
record, starting from a per-process offset.

Stdlib only.
"""
from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

try:
    from ..loadfactor import limit
except ImportError:   # hostkit imported as a top-level package (tests/ on sys.path)
    from loadfactor import limit

from .namespaces import (  # noqa: F401  (the plumbing these hosts are built on)
    HOST_OFFSET,
    INIT_NAME,
    MAX_HOSTS,
    NETNS_ETC,
    SSH_PORT,
    _INIT_SCRIPT,
    _SET_HOSTNAME,
    _TAG_RE,
    _bin,
    _choose_subnet,
    _cleanup_stale_once,
    _destroy,
    _host_pids,
    _ip,
    _names_for,
    _nspids,
    _pid_alive,
    _proc_start_time,
    _registry_lock,
    _rmdir_etc_netns_if_empty,
    _tag_in_use,
    _write_record,
    popen_in_pidns,
    skip_reason,
)

# --------------------------------------------------------------------------
# hosts
# --------------------------------------------------------------------------

@dataclass
class Host:
    index: int
    name: str
    ns: str
    ip: str
    sshd_pid: int | None = None
    veth: str = field(default="", repr=False)
    home: str = field(default="/root", repr=False)  # root's home inside the host
    sshd_config: str = field(default="", repr=False, compare=False)
    sshd_log: str = field(default="", repr=False, compare=False)
    sshd_pidfile: str = field(default="", repr=False, compare=False)
    _proc: subprocess.Popen | None = field(default=None, repr=False, compare=False)
    init_pid: int | None = field(default=None, repr=False, compare=False)
    _holder: subprocess.Popen | None = field(default=None, repr=False, compare=False)
    _pidns: tuple[int, int] | None = field(default=None, repr=False, compare=False)

    # -- the machine: PID 1 and its namespaces ------------------------------
    def _spawn_init(self, init_exe: str) -> None:
        """Start this host's PID 1: `ip netns exec` (the network namespace, /etc/netns/<ns>/
        over /etc, in a mount namespace of its own) runs `unshare --uts --pid --fork
        --mount-proc`, whose child is PID 1 of a new PID namespace with /proc mounted for it,
        sets the hostname and becomes mlh-init (sleep infinity, SIGCHLD ignored: it reaps
        every orphan). The unshare process stays outside as its parent (the holder)."""
        self._holder = subprocess.Popen(
            [_bin("ip"), "netns", "exec", self.ns, _bin("unshare"), "--uts", "--pid",
             "--fork", "--mount-proc", "--propagation", "slave", "--kill-child",
             _bin("bash"), "-c", _INIT_SCRIPT, self.name, init_exe],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True)
        self.init_pid = None

    def _wait_init(self, timeout: float) -> None:
        """Wait until the holder's child is mlh-init (hostname set, /proc mounted)."""
        h = self._holder
        assert h is not None
        t_end = time.monotonic() + timeout
        while True:
            if h.poll() is not None:
                raise RuntimeError(f"init of {self.name} exited with {h.returncode}: "
                                   f"{h.stderr.read().decode(errors='replace') if h.stderr else ''}")
            with contextlib.suppress(OSError, ValueError):
                with open(f"/proc/{h.pid}/task/{h.pid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
                if kids:
                    with open(f"/proc/{kids[0]}/comm") as f:
                        if f.read().strip() == INIT_NAME:
                            self.init_pid = kids[0]
                            st = os.stat(f"/proc/{kids[0]}/ns/pid")
                            self._pidns = (st.st_dev, st.st_ino)
                            if h.stderr is not None:
                                h.stderr.close()
                            return
            if time.monotonic() > t_end:
                raise RuntimeError(f"init of {self.name} not up after {timeout}s")
            time.sleep(0.002)

    def machine_pids(self) -> set[int]:
        """The fixture's own processes of this host, which pids() leaves out: its PID 1
        (mlh-init) and the unshare outside that holds it."""
        return {p for p in (self.init_pid, self._holder.pid if self._holder else None) if p}

    def _init(self) -> int:
        if self.init_pid is None or not _pid_alive(self.init_pid):
            raise RuntimeError(f"host {self.name} is down (its PID 1 is gone)")
        return self.init_pid

    # -- running commands ---------------------------------------------------
    def exec_prefix(self) -> list[str]:
        """argv prefix that runs a command inside this host: its PID, network, mount
        (/etc/netns/<ns>/ over /etc, its own /proc) and UTS namespaces, entered with
        nsenter, in the current directory. nsenter forks to enter the PID namespace, so a
        Popen of this argv is nsenter, not the command: popen() and run() give the command
        itself."""
        return [_bin("nsenter"), f"--target={self._init()}", "--pid", "--net", "--mount",
                "--uts", "--wd=.", "--"]

    def popen(self, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start argv inside this host in the background (text=True unless
        overridden; output not captured unless you pass stdout/stderr).
        The returned Popen's pid is the command itself (its PID here, in the root PID
        namespace: popen_in_pidns forks it straight into the host's PID namespace and
        nsenter joins the others without forking); the host's own /proc and ps show it as
        inner_pid(pid)."""
        kw.setdefault("text", True)
        init = self._init()
        return popen_in_pidns(init, [_bin("nsenter"), f"--target={init}", "--net", "--mount",
                                     "--uts", "--wd=.", "--", *argv], **kw)

    def run(self, argv: Sequence[str], *, input=None, timeout: float | None = None,
            check: bool = False, **kw) -> subprocess.CompletedProcess:
        """Run argv inside this host (text=True, capture_output=True unless
        overridden).  Like subprocess.run otherwise (check=False default)."""
        cap = kw.pop("capture_output", None)
        if cap or (cap is None and not any(k in kw for k in ("stdout", "stderr"))):
            kw.setdefault("stdout", subprocess.PIPE)
            kw.setdefault("stderr", subprocess.PIPE)
        if input is not None:
            kw["stdin"] = subprocess.PIPE
        with self.popen(argv, **kw) as p:
            try:
                out, err = p.communicate(input, timeout=timeout)
            except subprocess.TimeoutExpired as e:
                p.kill()
                e.output, e.stderr = p.communicate()
                raise
            except BaseException:
                p.kill()
                raise
        r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
        if check:
            r.check_returncode()
        return r

    def in_mounts(self, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        """Run argv in this host's mount namespace (the one its PID 1, its sshd and every
        session share), so a mount done here is seen by this host's ssh sessions only.
        The same as run() since every host command joins that namespace."""
        return self.run(argv, **kw)

    @property
    def hosts_file(self) -> str:
        """This host's /etc/hosts (bind-mounted from /etc/netns/<ns>/hosts)."""
        return os.path.join(NETNS_ETC, self.ns, "hosts")

    def pids(self) -> set[int]:
        """Every process of this host, by its PID here (the root PID namespace): those in
        its network namespace or in its PID namespace, but its own PID 1 and the process
        holding it (machine_pids())."""
        return _host_pids(self.ns, self._pidns) - self.machine_pids()

    def inner_pid(self, pid: int) -> int | None:
        """pid (a PID here) as the host's own /proc and ps show it; None when pid is not in
        the host's PID namespace."""
        ns = _nspids(pid)
        if len(ns) < 2 or self._pidns is None:
            return None
        try:
            st = os.stat(f"/proc/{pid}/ns/pid")
        except OSError:
            return None
        return ns[-1] if (st.st_dev, st.st_ino) == self._pidns else None

    def root_pid(self, inner: int) -> int | None:
        """The PID here of the process the host itself shows as inner (e.g. the os.getpid()
        a rank printed); None when the host has no such process."""
        for p in self.pids():
            if self.inner_pid(p) == inner:
                return p
        return None

    # -- sshd -------------------------------------------------------------
    def sshd_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start_sshd(self, timeout: float | None = None) -> None:
        """Start this host's sshd (no-op if it is running) and wait until it
        listens (its PidFile, written after bind, names our process); timeout: 10 s
        scaled to the load by default."""
        if self.sshd_running():
            return
        self._spawn_sshd()
        self._wait_sshd(limit(10.0) if timeout is None else timeout)

    def _spawn_sshd(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.sshd_pidfile)
        log = open(self.sshd_log, "ab")
        try:
            self._proc = self.popen(
                [_bin("sshd"), "-D", "-e", "-f", self.sshd_config], text=False,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        finally:
            log.close()
        self.sshd_pid = self._proc.pid

    def _wait_sshd(self, timeout: float) -> None:
        assert self._proc is not None
        t_end = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"sshd of {self.name} exited with {self._proc.returncode}: "
                    f"{self.sshd_log_tail()}")
            with contextlib.suppress(OSError, ValueError):
                with open(self.sshd_pidfile) as f:   # sshd writes its PID in the host
                    if int(f.read().strip() or 0) == self.inner_pid(self._proc.pid):
                        return
            if time.monotonic() > t_end:
                raise RuntimeError(f"sshd of {self.name} not ready after "
                                   f"{timeout}s: {self.sshd_log_tail()}")
            time.sleep(0.005)

    def sshd_log_tail(self, n: int = 2000) -> str:
        """Last n chars of this host's sshd log (sshd -e output)."""
        try:
            with open(self.sshd_log, errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return "(no log)"

    def stop_sshd(self, timeout: float | None = None) -> None:
        """Kill this host's sshd listener (by PID) and wait for it (5 s scaled to the load
        by default), then for its port to close.  Sessions it already forked keep running
        (as when a real sshd dies)."""
        timeout = limit(5.0) if timeout is None else timeout
        p = self._proc
        if p is not None and p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._proc = None
        self.sshd_pid = None
        self._wait_port_closed(timeout)

    def _wait_port_closed(self, timeout: float) -> None:
        """Wait until nothing in the host listens on the ssh port. The listener is
        reaped, but a session it forked just before the signal can hold the listening
        socket until it closes it; a connection made then is accepted into that socket's
        queue and closed without a word, rather than refused."""
        t_end = time.monotonic() + timeout
        while self._listening() and time.monotonic() < t_end:
            time.sleep(0.005)

    def _listening(self) -> bool:
        port = f":{SSH_PORT:04X} "
        for table in ("tcp", "tcp6"):
            with contextlib.suppress(OSError):
                with open(f"/proc/{self._init()}/net/{table}") as f:
                    for line in f.readlines()[1:]:
                        cols = line.split()
                        if cols[3] == "0A" and (cols[1] + " ").endswith(port):
                            return True
        return False

    # -- network ------------------------------------------------------------
    def link_down(self) -> None:
        """Take the host's cable out: set its bridge-side veth down (the host
        keeps its address; traffic to/from it is silently dropped)."""
        _ip("link", "set", self.veth, "down")

    def link_up(self) -> None:
        _ip("link", "set", self.veth, "up")

    # -- a frozen machine ---------------------------------------------------
    def freeze(self) -> set[int]:
        """Freeze the whole machine: SIGSTOP every process in it (sshd, its sessions, the
        ranks, its PID 1), as a hung kernel or a stalled VM looks from outside: the network
        is up, TCP still answers, nothing replies. Returns the PIDs stopped (pids(), and
        PID 1 if it runs)."""
        pids = self.pids() | ({self.init_pid} if self.init_pid else set())
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGSTOP)
        return pids

    def thaw(self) -> None:
        """SIGCONT every process in the host (the end of freeze())."""
        for p in self.pids() | ({self.init_pid} if self.init_pid else set()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)


class HostSet:
    """A set of hosts sharing one bridge/subnet.  Use make_hosts()."""

    def __init__(self, tag: str, subnet: ipaddress.IPv4Network, dir: str,
                 bridge: str) -> None:
        self.tag = tag
        self.subnet = subnet
        self.dir = dir
        self.bridge = bridge
        net = subnet.network_address
        self.gateway_ip = str(net + 1)
        self.hosts: list[Host] = []
        self.key_file = os.path.join(dir, "id_ed25519")
        self.known_hosts = os.path.join(dir, "known_hosts")
        self.ssh_config = os.path.join(dir, "ssh_config")
        self.authorized_keys = os.path.join(dir, "authorized_keys")
        self.owner_pid = os.getpid()
        self.closed = False
        self._ns_planned: list[str] = []
        self._veth_planned: list[str] = []
        # make_hosts(..., private_disk=True): a path every host sees as its own disk
        self.disk: str | None = None

    def disk_of(self, host: "Host") -> str:
        """Where, seen from here, host's private disk (hs.disk inside host) lives."""
        assert self.disk is not None, "make_hosts(..., private_disk=True) has no disk"
        return os.path.join(self.dir, "disks", host.name)

    def __repr__(self) -> str:
        return (f"HostSet(tag={self.tag!r}, subnet={self.subnet}, "
                f"hosts={[h.name for h in self.hosts]})")

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def by_name(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def ssh_argv(self, host: Host, *, connect_timeout: int = 10,
                 options: Mapping[str, str] | None = None) -> list[str]:
        """argv prefix for a plain OpenSSH client to `host` (append the remote
        command).  Works from the root namespace and from inside any host.

        OpenSSH uses the FIRST value given for an option, so pass overrides
        through `options` (they are emitted before the defaults)."""
        argv = ["ssh", "-F", "none"]
        for k, v in (options or {}).items():
            argv += ["-o", f"{k}={v}"]
        argv += [
            "-o", "BatchMode=yes",
            "-o", f"IdentityFile={self.key_file}",
            "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes",
            "-o", "ControlMaster=no",
            "-o", "ControlPath=none",
            "-o", f"ConnectTimeout={int(connect_timeout)}",
            "-o", "LogLevel=ERROR",
            "-p", str(SSH_PORT),
            "-l", "root",
            host.ip,
        ]
        return argv

    # -- teardown -----------------------------------------------------------
    def close(self, *, raise_errors: bool = True) -> None:
        """Full teardown: sshd and every process in the hosts, veths,
        namespaces, bridge, /etc/netns entries, temp dir, registry record.
        Idempotent.  Raises RuntimeError listing leftovers if any remain."""
        if self.closed:
            return
        self.closed = True
        _live_sets.discard(self)
        for h in self.hosts:
            # PID 1 first: the kernel kills the rest of its namespace. Its holder too: it
            # waits for PID 1, whose end waits until every process of its namespace is
            # reaped, including a zombie this process has yet to wait for.
            if h._holder is not None and h._holder.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    if h.init_pid is not None:
                        os.kill(h.init_pid, signal.SIGKILL)
                    h._holder.kill()
        for h in self.hosts:
            p = h._proc
            if p is not None and p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        errors = _destroy(self.tag, self._ns_planned, self._veth_planned,
                          self.bridge, self.dir)
        with contextlib.suppress(OSError), _registry_lock():
            _rmdir_etc_netns_if_empty()
        for h in self.hosts:
            p = h._proc
            if p is not None:
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(5)
                if p.poll() is None:
                    errors.append(f"sshd {p.pid} of {h.name} still running")
                h._proc = None
            h.sshd_pid = None
            p = h._holder
            if p is not None:
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(5)
                if p.poll() is None:
                    errors.append(f"init holder {p.pid} of {h.name} still running")
                with contextlib.suppress(OSError):
                    if p.stderr is not None:
                        p.stderr.close()
            h.init_pid = h._pidns = None
        if errors and raise_errors:
            raise RuntimeError(f"HostSet {self.tag} teardown incomplete: "
                               + "; ".join(errors))

    def __enter__(self) -> "HostSet":
        return self

    def __exit__(self, et, ev, tb) -> None:
        self.close(raise_errors=et is None)


_live_sets: "set[HostSet]" = set()


@atexit.register
def _close_all_at_exit() -> None:
    for hs in list(_live_sets):
        if hs.owner_pid == os.getpid():
            with contextlib.suppress(Exception):
                hs.close(raise_errors=False)


def _keygen(path: str, comment: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)


def _write(path: str, text: str, mode: int = 0o644) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _sshd_config(h: Host, hostkey: str, authorized_keys: str, pidfile: str) -> str:
    return "\n".join([
        f"ListenAddress {h.ip}",
        f"Port {SSH_PORT}",
        f"HostKey {hostkey}",
        f"AuthorizedKeysFile {authorized_keys}",
        f"PidFile {pidfile}",
        "UsePAM no",
        "StrictModes no",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "HostbasedAuthentication no",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "MaxSessions 100",
        "MaxStartups 100:30:200",
        "LoginGraceTime 30",
        "Subsystem sftp internal-sftp",
        # VERBOSE logs "Starting session: ..." per session: tests count sessions with it.
        "LogLevel VERBOSE",
        "",
    ])


@contextlib.contextmanager
def make_hosts(n: int, tag: str | None = None, *,
               isolated_home: bool = False, private_disk: bool = False) -> Iterator[HostSet]:
    """Bring up `n` hosts; tear everything down on exit (even on error).

    isolated_home=False: root logs in with its real home (/root, like a
    shared NFS home), so ssh sessions run root's ~/.bashrc (slow when it
    runs e.g. `pyenv init`) and get the PATH it sets.
    isolated_home=True: each host gets its own empty home directory for root
    (an /etc/netns/<ns>/passwd overlay), so nothing from /root is sourced,
    sessions start much faster and PATH is sshd's default
    (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin).
    private_disk=False: every host sees this machine's whole filesystem (a shared disk).
    private_disk=True: hosts that share no disk at one path, ``hs.disk`` (a directory of the
    set's temp dir): inside each host a directory of its own (``hs.disk_of(host)`` from here)
    is bind-mounted there, in the host's private mount namespace, so a file one host writes
    under hs.disk is on that host alone; this machine (the launcher's) sees its own directory
    there. Put the models, data and outputs jobs use under it; everything else stays shared."""
    hs = _build(n, tag, isolated_home, private_disk)
    try:
        yield hs
    except BaseException:
        hs.close(raise_errors=False)
        raise
    hs.close()


def _build(n: int, tag: str | None, isolated_home: bool = False,
           private_disk: bool = False) -> HostSet:
    reason = skip_reason()
    if reason is not None:
        raise RuntimeError(reason)
    if not 1 <= n <= MAX_HOSTS:
        raise ValueError(f"n must be in 1..{MAX_HOSTS}, got {n}")
    if tag is not None and not _TAG_RE.match(tag):
        raise ValueError(f"tag must match {_TAG_RE.pattern} (keeps interface "
                         f"names within 15 chars), got {tag!r}")
    _cleanup_stale_once()

    # Reserve tag + subnet and create the bridge under the global lock.
    with _registry_lock():
        if tag is None:
            for _ in range(100):
                tag = secrets.token_hex(3)
                if not _tag_in_use(tag):
                    break
            else:  # pragma: no cover
                raise RuntimeError("could not find a free tag")
        elif _tag_in_use(tag):
            raise RuntimeError(f"tag {tag!r} is already in use")
        bridge, ns_names, veths = _names_for(tag, n)
        subnet = _choose_subnet()
        tmp = tempfile.mkdtemp(prefix=f"mlh-{tag}-")
        open(os.path.join(tmp, ".mlh-hosts"), "w").close()  # ownership marker
        hs = HostSet(tag, subnet, tmp, bridge)
        hs._ns_planned = ns_names
        hs._veth_planned = veths
        _live_sets.add(hs)
        _write_record({"tag": tag, "pid": os.getpid(),
                       "start": _proc_start_time(os.getpid()),
                       "n": n, "subnet": str(subnet), "dir": tmp,
                       "bridge": bridge})
        try:
            for ns in ns_names:
                os.makedirs(os.path.join(NETNS_ETC, ns), exist_ok=True)
            _ip("-batch", "-", input=(
                f"link add {bridge} type bridge\n"
                f"addr add {hs.gateway_ip}/24 dev {bridge}\n"
                f"link set {bridge} up\n"))
        except BaseException:
            hs.close(raise_errors=False)
            raise

    try:
        _room_in_the_neighbour_table()
        _populate(hs, n, ns_names, veths, isolated_home)
        if private_disk:
            _private_disks(hs)
    except BaseException:
        hs.close(raise_errors=False)
        raise
    return hs


def _private_disks(hs: HostSet) -> None:
    """hs.disk made, and on each host its own directory bind-mounted over it (make_hosts's
    private_disk). The hosts' mount namespaces are slaves of this machine's, so the bind stays
    inside the host; it ends with the host's PID 1."""
    hs.disk = os.path.join(hs.dir, "disk")
    os.makedirs(hs.disk, mode=0o755)
    for h in hs.hosts:
        own = hs.disk_of(h)
        os.makedirs(own, mode=0o755)
        r = h.in_mounts(["mount", "--bind", own, hs.disk])
        if r.returncode != 0:
            raise RuntimeError(f"private disk of {h.name}: mount --bind failed: {r.stderr.strip()}")


def _passwd_with_home(home: str) -> str:
    out = []
    with open("/etc/passwd") as f:
        for line in f:
            parts = line.rstrip("\n").split(":")
            if len(parts) == 7 and parts[0] == "root":
                parts[5] = home
                line = ":".join(parts) + "\n"
            out.append(line)
    return "".join(out)


def _populate(hs: HostSet, n: int, ns_names: list[str], veths: list[str],
              isolated_home: bool) -> None:
    net = hs.subnet.network_address
    prefix = hs.subnet.prefixlen
    for i in range(n):
        hs.hosts.append(Host(index=i, name=ns_names[i], ns=ns_names[i],
                             ip=str(net + HOST_OFFSET + i), veth=veths[i]))

    # Keys: one client key, one host key per host (generated in parallel).
    jobs = [_keygen(hs.key_file, f"mlh-{hs.tag}-client")]
    hostkeys = [os.path.join(hs.dir, f"{h.name}.hostkey") for h in hs.hosts]
    jobs += [_keygen(k, h.name) for k, h in zip(hostkeys, hs.hosts)]

    # Network: namespaces, veth pairs on the bridge, addresses.
    root_cmds = []
    for h in hs.hosts:
        root_cmds += [f"netns add {h.ns}",
                      f"link add {h.veth} type veth peer name eth0 netns {h.ns}",
                      f"link set {h.veth} master {hs.bridge} up"]
    _ip("-batch", "-", input="\n".join(root_cmds) + "\n")
    for h in hs.hosts:
        _ip("-n", h.ns, "-batch", "-", input=(
            "link set lo up\n"
            f"addr add {h.ip}/{prefix} dev eth0\n"
            "link set eth0 up\n"))

    # /etc/netns/<ns>/hosts: every host name resolves to its real IP.
    hosts_text = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    hosts_text += "".join(f"{h.ip}\t{h.name}\n" for h in hs.hosts)
    for h in hs.hosts:
        d = os.path.join(NETNS_ETC, h.ns)
        os.makedirs(d, exist_ok=True)
        _write(os.path.join(d, "hosts"), hosts_text)
        if isolated_home:
            h.home = os.path.join(hs.dir, "home", h.name)
            os.makedirs(h.home, mode=0o700)
            _write(os.path.join(d, "passwd"), _passwd_with_home(h.home))

    for j in jobs:
        _, err = j.communicate()
        if j.returncode != 0:
            raise RuntimeError(f"ssh-keygen failed: {err.decode(errors='replace')}")

    with open(hs.key_file + ".pub") as f:
        _write(hs.authorized_keys, f.read(), 0o600)
    kh_lines, cfg = [], []
    for h, k in zip(hs.hosts, hostkeys):
        with open(k + ".pub") as f:
            ktype, kdata = f.read().split()[:2]
        kh_lines.append(f"{h.ip},{h.name} {ktype} {kdata}\n")
        cfg.append(
            f"Host {h.name} {h.ip}\n"
            f"    HostName {h.ip}\n"
            f"    Port {SSH_PORT}\n"
            "    User root\n"
            f"    IdentityFile {hs.key_file}\n"
            "    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {hs.known_hosts}\n"
            "    GlobalKnownHostsFile /dev/null\n"
            "    StrictHostKeyChecking yes\n"
            "    BatchMode yes\n"
            "    ControlMaster no\n"
            "    ControlPath none\n"
            "    ConnectTimeout 10\n"
            "    LogLevel ERROR\n")
    _write(hs.known_hosts, "".join(kh_lines))
    _write(hs.ssh_config, "\n".join(cfg))

    # sshd privilege-separation dir (Debian's sshd refuses to start without).
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    for h, k in zip(hs.hosts, hostkeys):
        h.sshd_config = os.path.join(hs.dir, f"{h.name}.sshd_config")
        h.sshd_log = os.path.join(hs.dir, f"{h.name}.sshd.log")
        h.sshd_pidfile = os.path.join(hs.dir, f"{h.name}.sshd.pid")
        _write(h.sshd_config, _sshd_config(h, k, hs.authorized_keys, h.sshd_pidfile))
    init_exe = os.path.join(hs.dir, INIT_NAME)   # `sleep`, named mlh-init in ps
    os.symlink(_bin("sleep"), init_exe)
    for h in hs.hosts:
        h._spawn_init(init_exe)
    for h in hs.hosts:
        h._wait_init(limit(15.0))
    for h in hs.hosts:
        h._spawn_sshd()
    for h in hs.hosts:
        h._wait_sshd(limit(15.0))
    # Sanity: every sshd is reachable from the root namespace via the bridge.
    for h in hs.hosts:
        _wait_tcp(h.ip, SSH_PORT, limit(10.0))


# The kernel's ARP table is one for every network namespace, capped by gc_thresh3 (1024 by
# default): the host sets of a test run (full meshes of gloo, preflight's mesh check, Ray,
# the launcher's connections from the root namespace) filled it, and past it a dial fails
# with "No route to host" or times out (dmesg: "arp_cache: neighbor table overflow!"; seen
# building a 4-host set after a day of runs, and at 64 hosts). Raised, never lowered.
NEIGH_THRESH = {1: 8192, 2: 32768, 3: 65536}


def _room_in_the_neighbour_table() -> None:
    for k, want in NEIGH_THRESH.items():
        path = f"/proc/sys/net/ipv4/neigh/default/gc_thresh{k}"
        try:
            with open(path) as fh:
                if int(fh.read().split()[0]) >= want:
                    continue
            with open(path, "w") as fh:
                fh.write(str(want))
        except (OSError, ValueError):
            pass   # not ours to change here: the sets still work while the table has room


def _wait_tcp(ip: str, port: int, timeout: float) -> None:
    t_end = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((ip, port), timeout=1.0):
                return
        except OSError as e:
            if time.monotonic() > t_end:
                raise RuntimeError(f"{ip}:{port} unreachable: {e}") from e
            time.sleep(0.01)


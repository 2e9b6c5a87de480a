"""Namespace plumbing of the test hosts: network namespaces, veths, the bridge, subnets,
the registry of live host sets and the cleanup of crashed runs. See tests/hostkit/sshd.py
for the hosts themselves and the layout they follow.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Iterator, Sequence


PREFIX = "mlh"
REG_DIR = "/run/mlh-hosts"
NETNS_ETC = "/etc/netns"
NETNS_RUN = "/run/netns"
SUBNET_BASE = (10, 213)  # 10.213.<k>.0/24
HOST_OFFSET = 11  # host i -> .<11+i>
MAX_HOSTS = 200
SSH_PORT = 22

_TAG_RE = re.compile(r"^[a-z0-9]{1,6}$")
_NS_RE = re.compile(r"^mlh-([a-z0-9]{1,6})-(\d{1,3})$")
_BR_RE = re.compile(r"^mlhb-([a-z0-9]{1,6})$")
_VETH_RE = re.compile(r"^mlhv-([a-z0-9]{1,6})-(\d{1,3})$")
_TMP_RE = re.compile(r"^mlh-([a-z0-9]{1,6})-[A-Za-z0-9_]{8}$")

# sh snippet run after `unshare --uts`: set the hostname, then become argv.
_SET_HOSTNAME = 'hostname "$0" && exec "$@"'

# bash snippet that becomes a host's PID 1 (see tests/hostkit/sshd.py, "PID namespaces"):
# set the hostname, ignore SIGCHLD (the kernel then reaps every child and orphan the init is
# given: no zombies, no wait loop), become `sleep infinity` under the name mlh-init ($1: a
# symlink to sleep). bash, not dash: dash's `trap '' CHLD` leaves SIGCHLD at its default.
_INIT_SCRIPT = 'hostname "$0" && trap "" CHLD && exec "$1" infinity'
INIT_NAME = "mlh-init"

CLONE_NEWPID = 0x20000000


# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------

def _which(name: str) -> str | None:
    path = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin"
    return shutil.which(name, path=path)


@functools.lru_cache(maxsize=None)
def _bin(name: str) -> str:
    """Absolute path of a tool (so callers may pass env= without PATH)."""
    return _which(name) or name


def _ip(*args: str, check: bool = True, input: str | None = None,
        ) -> subprocess.CompletedProcess:
    r = subprocess.run([_bin("ip"), *args], text=True, capture_output=True,
                       input=input)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({r.returncode}): "
                           f"{r.stderr.strip()}")
    return r


def _proc_start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # field 22 (starttime); fields after the ")" that closes comm start at 3.
    return int(stat.rsplit(")", 1)[1].split()[19])


def _pid_alive(pid: int) -> bool:
    """True when pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _nspids(pid: int) -> list[int]:
    """pid's PID in each PID namespace it is in, outermost first (the NSpid line of
    /proc/<pid>/status); [] when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def _is_pidns_init(pid: int) -> bool:
    """True when pid is PID 1 of a PID namespace below ours (a test host's mlh-init)."""
    ns = _nspids(pid)
    return len(ns) > 1 and ns[-1] == 1


def _ns_key(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


_libc = None


def _setns(fd: int, nstype: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def popen_in_pidns(init_pid: int, argv: Sequence[str], **kw) -> subprocess.Popen:
    """subprocess.Popen(argv, **kw) whose process is born in the PID namespace of init_pid.

    setns(CLONE_NEWPID) changes only the namespace the calling thread's next children are
    born in (not the thread itself, not the other threads): this thread enters the target
    namespace, forks the Popen, and comes back to its own (always allowed: the namespace a
    thread runs in is an ancestor of the target). So the Popen's pid is the command's own PID
    (seen from here), nothing forks in between (unlike `nsenter --pid`), and kill(),
    wait() and timeouts work on the command itself. argv still has to join the host's
    other namespaces (nsenter --net --mount --uts, which then execs without forking)."""
    target = os.open(f"/proc/{init_pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    try:
        mine = os.open("/proc/thread-self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target, CLONE_NEWPID)
            try:
                return subprocess.Popen(list(argv), **kw)
            finally:
                _setns(mine, CLONE_NEWPID)
        finally:
            os.close(mine)
    finally:
        os.close(target)


def _netns_pids(names: Sequence[str]) -> dict[str, set[int]]:
    """Same as `ip netns pids <ns>` for several namespaces with one /proc scan."""
    want: dict[tuple[int, int], str] = {}
    for n in names:
        try:
            st = os.stat(os.path.join(NETNS_RUN, n))
        except OSError:
            continue
        want[(st.st_dev, st.st_ino)] = n
    out: dict[str, set[int]] = {n: set() for n in names}
    if not want:
        return out
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            st = os.stat(f"/proc/{d}/ns/net")
        except OSError:
            continue
        n = want.get((st.st_dev, st.st_ino))
        if n is not None:
            out[n].add(int(d))
    return out


def _host_pids(netns: str, pidns: tuple[int, int] | None) -> set[int]:
    """Every process in network namespace netns or in PID namespace pidns (a (dev, inode)
    key), by its PID here, with one /proc scan."""
    net = _ns_key(os.path.join(NETNS_RUN, netns))
    out: set[int] = set()
    if net is None and pidns is None:
        return out
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        if (net is not None and _ns_key(f"/proc/{d}/ns/net") == net) or \
                (pidns is not None and _ns_key(f"/proc/{d}/ns/pid") == pidns):
            out.add(int(d))
    return out


def _kill_netns_procs(names: Sequence[str], grace: float = 0.5,
                      hard_deadline: float = 10.0) -> set[int]:
    """SIGTERM every process in the namespaces, then SIGKILL what is left.

    Returns the pids still present at the end (normally empty)."""
    def send(pids: set[int], sig: int) -> None:
        for p in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, sig)

    def remaining() -> set[int]:
        return set().union(*_netns_pids(names).values()) if names else set()

    left = remaining()
    if not left:
        return left
    send(left, signal.SIGTERM)
    # A host's PID 1 (mlh-init) has no TERM handler, so TERM does nothing to it: KILL it
    # now, which kills every process of its PID namespace with it.
    send({p for p in left if _is_pidns_init(p)}, signal.SIGKILL)
    t_end = time.monotonic() + grace
    while left and time.monotonic() < t_end:
        time.sleep(0.01)
        left = remaining()
    t_end = time.monotonic() + hard_deadline
    while left and time.monotonic() < t_end:
        send(left, signal.SIGKILL)
        time.sleep(0.01)
        left = remaining()
    return left


def _existing_netns() -> set[str]:
    try:
        return set(os.listdir(NETNS_RUN))
    except OSError:
        return set()


def _existing_links() -> set[str]:
    r = _ip("-o", "link", "show", check=False)
    names = set()
    for line in r.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.add(parts[1].strip().split("@", 1)[0])
    return names


def _used_networks() -> list[ipaddress.IPv4Network]:
    """IPv4 networks present in the root namespace (addresses and routes)."""
    nets: list[ipaddress.IPv4Network] = []
    for line in _ip("-4", "-o", "addr", "show", check=False).stdout.splitlines():
        tok = line.split()
        if "inet" in tok:
            with contextlib.suppress(ValueError, IndexError):
                nets.append(ipaddress.ip_interface(tok[tok.index("inet") + 1]).network)
    for line in _ip("-4", "route", "show", "table", "all", check=False).stdout.splitlines():
        tok = line.split()
        if not tok:
            continue
        dest = tok[1] if tok[0] in ("local", "broadcast", "unicast", "multicast",
                                    "unreachable", "prohibit", "blackhole",
                                    "throw", "nat", "anycast") else tok[0]
        if dest == "default":
            continue
        with contextlib.suppress(ValueError):
            net = ipaddress.ip_network(dest, strict=False)
            if net.prefixlen > 0:
                nets.append(net)
    return nets


def _subnet(k: int) -> ipaddress.IPv4Network:
    return ipaddress.ip_network(f"{SUBNET_BASE[0]}.{SUBNET_BASE[1]}.{k}.0/24")


# --------------------------------------------------------------------------
# registry (ownership of resources, so stale ones from crashed runs can go)
# --------------------------------------------------------------------------

@contextlib.contextmanager
def _registry_lock() -> Iterator[None]:
    os.makedirs(REG_DIR, mode=0o755, exist_ok=True)
    fd = os.open(REG_DIR, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def _reg_path(tag: str) -> str:
    return os.path.join(REG_DIR, f"{tag}.json")


def _write_record(rec: dict) -> None:
    path = _reg_path(rec["tag"])
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.replace(tmp, path)


def _read_records() -> list[dict]:
    recs = []
    with contextlib.suppress(FileNotFoundError):
        for fn in os.listdir(REG_DIR):
            if not fn.endswith(".json"):
                continue
            try:
                with open(os.path.join(REG_DIR, fn)) as f:
                    rec = json.load(f)
                rec.setdefault("tag", fn[:-5])
            except (OSError, ValueError):
                rec = {"tag": fn[:-5], "pid": -1, "start": None}
            recs.append(rec)
    return recs


def _record_alive(rec: dict) -> bool:
    pid = rec.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    st = _proc_start_time(pid)
    return st is not None and st == rec.get("start") and _pid_alive(pid)


def _names_for(tag: str, n: int) -> tuple[str, list[str], list[str]]:
    return (f"mlhb-{tag}", [f"mlh-{tag}-{i}" for i in range(n)],
            [f"mlhv-{tag}-{i}" for i in range(n)])


def _destroy(tag: str, ns_names: Sequence[str], veths: Sequence[str],
             bridge: str | None, tmp_dir: str | None) -> list[str]:
    """Remove everything belonging to one tag. Returns error strings."""
    errors: list[str] = []
    left = _kill_netns_procs(list(ns_names))
    if left:
        errors.append(f"processes survived SIGKILL: {sorted(left)}")
    links = _existing_links()
    # Deleting the root-side veth removes its peer synchronously (namespace
    # destruction is asynchronous, so don't rely on it for the veth).
    for v in veths:
        if v in links:
            r = _ip("link", "del", v, check=False)
            if r.returncode != 0:
                errors.append(f"ip link del {v}: {r.stderr.strip()}")
    existing = _existing_netns()
    for ns in ns_names:
        if ns in existing:
            r = _ip("netns", "del", ns, check=False)
            if r.returncode != 0:
                errors.append(f"ip netns del {ns}: {r.stderr.strip()}")
        d = os.path.join(NETNS_ETC, ns)
        if os.path.lexists(d):
            shutil.rmtree(d, ignore_errors=True)
            if os.path.lexists(d):
                errors.append(f"could not remove {d}")
    if bridge and bridge in links:
        r = _ip("link", "del", bridge, check=False)
        if r.returncode != 0:
            errors.append(f"ip link del {bridge}: {r.stderr.strip()}")
    if tmp_dir and os.path.isdir(tmp_dir):
        shutil.rmtree(tmp_dir, ignore_errors=True)
        if os.path.exists(tmp_dir):
            errors.append(f"could not remove {tmp_dir}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_reg_path(tag))
    return errors


def _rmdir_etc_netns_if_empty() -> None:
    """Remove /etc/netns when we emptied it.  Call with the registry lock held
    (HostSets create their /etc/netns/<ns> dirs under the same lock)."""
    with contextlib.suppress(OSError):
        if not os.listdir(NETNS_ETC):
            os.rmdir(NETNS_ETC)


def _cleanup_stale_locked() -> list[str]:
    """Remove resources with our prefix whose owner process is gone.

    Caller holds the registry lock.  Returns the tags that were cleaned."""
    cleaned: set[str] = set()
    live: set[str] = set()
    for rec in _read_records():
        if _record_alive(rec):
            live.add(rec["tag"])
            continue
        tag = rec["tag"]
        if not _TAG_RE.match(str(tag)):
            with contextlib.suppress(OSError):
                os.unlink(_reg_path(str(tag)))
            continue
        br, nss, vs = _names_for(tag, int(rec.get("n", 0)))
        _destroy(tag, nss, vs, br, rec.get("dir"))
        cleaned.add(tag)

    # Orphans with our naming prefix and no live owner record.
    orphan_ns: dict[str, list[str]] = {}
    for ns in _existing_netns():
        m = _NS_RE.match(ns)
        if m and m.group(1) not in live:
            orphan_ns.setdefault(m.group(1), []).append(ns)
    orphan_links: dict[str, list[str]] = {}
    orphan_br: dict[str, str] = {}
    for ln in _existing_links():
        m = _VETH_RE.match(ln)
        if m and m.group(1) not in live:
            orphan_links.setdefault(m.group(1), []).append(ln)
        m = _BR_RE.match(ln)
        if m and m.group(1) not in live:
            orphan_br[m.group(1)] = ln
    orphan_etc: dict[str, list[str]] = {}
    with contextlib.suppress(OSError):
        for d in os.listdir(NETNS_ETC):
            m = _NS_RE.match(d)
            if m and m.group(1) not in live:
                orphan_etc.setdefault(m.group(1), []).append(d)
    orphan_tmp: dict[str, str] = {}
    tmp_root = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for d in os.listdir(tmp_root):
            m = _TMP_RE.match(d)
            p = os.path.join(tmp_root, d)
            if m and m.group(1) not in live and os.path.isdir(p) \
                    and os.path.exists(os.path.join(p, ".mlh-hosts")):
                orphan_tmp[m.group(1)] = p
    for tag in (set(orphan_ns) | set(orphan_links) | set(orphan_br)
                | set(orphan_etc) | set(orphan_tmp)):
        nss = sorted(set(orphan_ns.get(tag, [])) | set(orphan_etc.get(tag, [])))
        _destroy(tag, nss, orphan_links.get(tag, []), orphan_br.get(tag),
                 orphan_tmp.get(tag))
        cleaned.add(tag)
    _rmdir_etc_netns_if_empty()
    return sorted(cleaned)


def cleanup_stale() -> list[str]:
    """Best-effort removal of resources left by crashed earlier runs.

    Only touches names with our prefix (mlh-/mlhb-/mlhv-) whose owning
    process (recorded in /run/mlh-hosts) is no longer alive; HostSets of
    other live processes are left alone.  Returns the tags removed."""
    if skip_reason() is not None:
        return []
    with _registry_lock():
        return _cleanup_stale_locked()


_stale_checked = False
_stale_lock = threading.Lock()


def _cleanup_stale_once() -> None:
    global _stale_checked
    with _stale_lock:
        if _stale_checked:
            return
        _stale_checked = True
    with contextlib.suppress(Exception):
        cleanup_stale()


# --------------------------------------------------------------------------
# availability
# --------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def skip_reason() -> str | None:
    """None when hosts can be built here, else a human-readable reason."""
    if not os.uname().sysname == "Linux":
        return "multi-host fixture needs Linux network namespaces"
    if os.geteuid() != 0:
        return "multi-host fixture needs root (network namespaces, bridges, sshd)"
    missing = [b for b in ("ip", "unshare", "nsenter", "bash", "sleep", "hostname", "ssh",
                           "ssh-keygen", "sshd")
               if _which(b) is None]
    if missing:
        return f"multi-host fixture: missing binaries: {', '.join(missing)}"
    if not all(os.path.exists(f"/proc/self/ns/{t}") for t in ("net", "uts", "pid", "mnt")):
        return "multi-host fixture: kernel lacks network/UTS/PID/mount namespace support"
    # Functional probe in an anonymous namespace (vanishes with the process).
    try:
        r = subprocess.run(
            ["unshare", "--net", "--uts", "--pid", "--fork", "--mount-proc", "sh", "-c",
             "ip link add mlhprobe0 type veth peer name mlhprobe1 && "
             "ip link add mlhprobebr type bridge && "
             "ip link set mlhprobe0 master mlhprobebr && hostname mlhprobe"],
            capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"multi-host fixture: namespace probe failed: {e}"
    if r.returncode != 0:
        return ("multi-host fixture: cannot create netns/veth/bridge here: "
                + (r.stderr.strip() or f"exit {r.returncode}"))
    return None



# --------------------------------------------------------------------------
# construction
# --------------------------------------------------------------------------

def _choose_subnet() -> ipaddress.IPv4Network:
    used = _used_networks()
    for rec in _read_records():
        if _record_alive(rec) and rec.get("subnet"):
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(rec["subnet"]))
    start = (os.getpid() * 7 + int(time.monotonic() * 1000)) % 254
    for j in range(254):
        k = 1 + (start + j) % 254
        net = _subnet(k)
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free 10.213.<k>.0/24 subnet for test hosts")


def _tag_in_use(tag: str) -> bool:
    if os.path.exists(_reg_path(tag)):
        return True
    if any(_NS_RE.match(n) and n.startswith(f"mlh-{tag}-")
           for n in _existing_netns()):
        return True
    return f"mlhb-{tag}" in _existing_links()



"""A real Slurm cluster on this machine, over the namespace hosts of tests/hosts.py.

slurmctld runs in the root network namespace (in a UTS namespace of its own, whose hostname
is its SlurmctldHost) and listens on the host set's bridge address; one slurmd runs in each
host's network namespace. One munged serves them all through a socket in the cluster's own
directory. Nothing under /etc/slurm, /etc/munge or the machine's /etc/hosts is touched:
every daemon and client reads this cluster's slurm.conf through SLURM_CONF.

Why this shape (see shared/FACTS.md, Slurm): `ip netns exec` remounts /sys and hides the
cgroup fs, and slurmd 22.05 then refuses to start, so slurmd joins the host's network, UTS
and PID namespaces (born in its PID namespace, then `nsenter --net --uts`) but not its mount
namespace: `unshare --mount` gives it a private copy of the machine's, with the host's hosts
file bind-mounted over /etc/hosts and a /proc of the host's PID namespace, so slurmd and
its jobs see only the host's processes, as on a separate machine.

Debian 12's packages: slurmctld, slurmd, slurm-client, munge (Slurm 22.05).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Iterator

try:
    from ..loadfactor import limit
except ImportError:   # hostkit imported as a top-level package (tests/ on sys.path)
    from loadfactor import limit

try:  # imported as tests.hostkit.slurm
    from .namespaces import popen_in_pidns
except ImportError:  # pragma: no cover
    from hostkit.namespaces import popen_in_pidns

SLURM_BINS = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo", "munged")


def skip_reason() -> str | None:
    """Why a Slurm cluster cannot be built here, or None."""
    if os.geteuid() != 0:
        return "Slurm test cluster needs root (daemons, namespaces)"
    missing = [b for b in SLURM_BINS if not _which(b)]
    if missing:
        return (f"Slurm test cluster: {', '.join(missing)} not installed "
                "(apt-get install slurmctld slurmd slurm-client munge; ./run-tests.sh does)")
    return None


def _which(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """One running cluster: its config, its client environment, its daemons."""

    def __init__(self, hs, cpus: int = 4):
        self.hs, self.cpus = hs, cpus
        self.dir = tempfile.mkdtemp(prefix=f"mlslurm-{hs.tag}-")
        os.chmod(self.dir, 0o755)
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.nodes = [h.name for h in hs.hosts]
        self.controller = f"mlctl-{hs.tag}"
        self.env = {**os.environ, "SLURM_CONF": self.conf}
        self._procs: list[subprocess.Popen] = []

    # -- bring-up ---------------------------------------------------------------------------
    def start(self, timeout: float | None = None) -> "SlurmCluster":
        timeout = limit(60) if timeout is None else timeout
        self._start_munge()
        self._write_conf()
        self._spawn("slurmctld", ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                                  self.controller, _which("slurmctld"), "-D", "-i", "-f", self.conf])
        for h in self.hs.hosts:
            os.makedirs(os.path.join(self.dir, "spool", h.name), exist_ok=True)
            # In the host's PID, network and UTS namespaces (its own processes, its IP, its
            # hostname), in a mount namespace of its own made from the machine's (the real
            # /sys), with the host's hosts file and a /proc of the host's PID namespace.
            self._spawn(f"slurmd-{h.name}", [
                _which("nsenter"), f"--target={h.init_pid}", "--net", "--uts", "--",
                _which("unshare"), "--mount", "--propagation", "private", "sh", "-c",
                'mount --bind "$0" /etc/hosts && mount -t proc proc /proc && exec "$@"',
                h.hosts_file, _which("slurmd"), "-D", "-N", h.name, "-f", self.conf],
                pidns_of=h)
        self._wait_idle(timeout)
        return self

    def _start_munge(self) -> None:
        mdir = os.path.join(self.dir, "munge")
        os.makedirs(mdir)
        os.chmod(mdir, 0o755)   # munge refuses a socket directory others can write, or none
        key = os.path.join(mdir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self.munge_socket = os.path.join(mdir, "munge.socket")
        self._spawn("munged", [_which("munged"), "-F", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={mdir}/munged.pid",
                               f"--log-file={mdir}/munged.log", f"--seed-file={mdir}/seed"])
        _wait_for(lambda: os.path.exists(self.munge_socket), 10, "munged socket")

    def _write_conf(self) -> None:
        d, hs = self.dir, self.hs
        os.makedirs(os.path.join(d, "state"))
        with open(os.path.join(d, "plugstack.conf"), "w"):
            pass   # an empty plugin stack: never read the machine's /etc/slurm
        nodes = "\n".join(f"NodeName={h.name} NodeAddr={h.ip} CPUs={self.cpus} State=UNKNOWN"
                          for h in hs.hosts)
        text = f"""ClusterName=mlt{hs.tag}
SlurmctldHost={self.controller}({hs.gateway_ip})
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
PlugStackConfig={d}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=5
MessageTimeout=10
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        with open(self.conf, "w") as f:
            f.write(text)

    def _spawn(self, name: str, argv: list[str], pidns_of=None) -> None:
        """Start a daemon; pidns_of: a Host whose PID namespace it is born in."""
        log = open(os.path.join(self.dir, f"{name}.out"), "wb")
        kw = dict(stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                  start_new_session=True, env={**os.environ, "SLURM_CONF": self.conf})
        try:
            if pidns_of is None:
                self._procs.append(subprocess.Popen(argv, **kw))
            else:
                self._procs.append(popen_in_pidns(pidns_of.init_pid, argv, **kw))
        finally:
            log.close()

    def _wait_idle(self, timeout: float) -> None:
        def idle() -> bool:
            r = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
            states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
            return len(states) == len(self.nodes) and all(s == "idle" for s in states.values())
        _wait_for(idle, timeout, f"Slurm nodes idle\n{self.logs()}")

    # -- use --------------------------------------------------------------------------------
    def run(self, argv: list[str], check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster (timeout: 30 s scaled to the load)."""
        timeout = limit(30) if timeout is None else timeout
        return subprocess.run(argv, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=check)

    def logs(self) -> str:
        out = []
        for name in sorted(os.listdir(self.dir)):
            if name.endswith((".log", ".out")):
                with open(os.path.join(self.dir, name), errors="replace") as f:
                    out.append(f"--- {name}\n{f.read()[-2000:]}")
        return "\n".join(out)

    # -- teardown ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every daemon this cluster started (by pid), then remove its directory."""
        for p in reversed(self._procs):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self._procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


def _wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


@contextlib.contextmanager
def make_slurm(hs, cpus: int = 4) -> Iterator[SlurmCluster]:
    """A started cluster over HostSet hs; stopped on exit."""
    cluster = SlurmCluster(hs, cpus)
    try:
        yield cluster.start()
    finally:
        cluster.close()

"""SSH executor: one `ssh` client per node whose connection also carries the run's short
scripts (transport/openssh.py); fabric and paramiko read the ssh_config and known_hosts files
and explain a failed login. They are imported only where needed (an ssh_config that names
UserKnownHostsFile, a login that failed): importing them costs CPU before the first login
could begin (bench/results/time-to-training-*)."""
from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
from concurrent.futures import ThreadPoolExecutor

from .. import nodeprog, render
from ..errors import Problem, UserError
from ..plan.launch_plan import LaunchPlan, NodePlan, node_python
from ..spec import SSH
from .base import STAGE_TIMEOUT_S, drop_logs_by_run, setup_failed, stage_text
from .relay import relay_config
from .openssh import READY, STAGED, OpenSSHStreams
from .openssh_running import OpenSSHRunning
from ..spec.hosts import login_addr


class SSHExecutor:
    """Reaches every host with fabric, honouring ssh_config, agent, key file, jump host, known_hosts."""

    def __init__(self, hosts: list[str], ssh: SSH):
        # Keyed by login ([user@]host[:port]): one host name on two ports is two machines.
        self._hosts = list(dict.fromkeys(hosts))
        self._ssh = ssh
        self._conns: dict = {}   # login -> its fabric Connection, opened (a failed login explained)
        self._made: dict = {}    # login -> its fabric Connection, made (known_hosts files, a failure)
        self._config = None      # fabric's Config: one parsed ssh_config for all hosts (_fabric_config)
        self._streams = OpenSSHStreams(ssh)   # node output via `ssh` children
        self._relay_head = b""   # the relay's interpreter and config (stage())
        self.python = "python3"   # the relay's interpreter where no plan is staged (`exec`)
        self._parsed: dict = {}   # known_hosts files, read once: paramiko.HostKeys by their paths

    def connect(self) -> list[Problem]:
        """Every host's stream client logged in and waiting for its node's script; a line for
        each host that refused."""
        if shutil.which("ssh") is None:
            raise UserError("the OpenSSH client (ssh) is not installed here; mlaunch runs each "
                            "node's session in one: install it (e.g. apt-get install openssh-client)")
        for host in self._hosts:
            self._add_stream(host)
        self._streams.spawn(_stream_command())
        failed = self._streams.await_ready(self._ssh.connect_timeout + 10)
        # paramiko says why a login failed (a changed key, the fix for an unknown one); where
        # it gets in, the client's own words stand. Where the client never reached sshd (no
        # route, refused, no banner) its words are the cause: paramiko would only wait again.
        asked = {h: self._connection(h) for h in failed if h not in self._streams.unreached}
        explained = {p.path: p for p in self._open_all(asked)}
        return [explained.get(p.path, p) for p in failed.values()]

    def warm(self, plan: LaunchPlan) -> None:
        """Each node's warm frame (cluster.warm_start) to its waiting session, behind the relay
        head of the plan as it stands (the relay's interpreter and what it masks come from the
        spec, which preflight does not change); before connect(), each goes as soon as its
        host is logged in. Only where each host runs one node."""
        logins = [n.login for n in plan.nodes]
        frames = {n.login: render.framed(n.warm) for n in plan.nodes if n.warm}
        if frames and len(set(logins)) == len(logins):
            self._streams.warm(frames, relay_head(node_python(plan.job), relay_config(plan)))

    def stage(self, plan: LaunchPlan) -> None:
        self._relay_head = relay_head(node_python(plan.job), relay_config(plan))
        targets = [plan.nodes[0].login] if plan.shared else self._hosts
        self._streams.spawn(_stream_command())   # a later attempt's sessions
        if failed := self._streams.await_ready(self._ssh.connect_timeout + 10):
            raise UserError(list(failed.values()), header="cannot reach every host; nothing was started anywhere:")
        # Each node's waiting session stages its files itself (no session of their own), and
        # no node starts before every host has said it staged (templates/stage_step.sh.j2).
        script = stage_text(plan)
        failed = self._streams.stage({h: render.framed(script if h in targets else "") for h in self._hosts},
                                     STAGE_TIMEOUT_S, self._relay_head)
        if failed:
            raise UserError([setup_failed(h, words) for h, words in failed.items()])

    def start(self, node: NodePlan) -> OpenSSHRunning:
        # `exec` stages nothing: its sessions' stage is empty, their relay masks and copies nothing
        head = self._relay_head or relay_head(self.python, {})
        if not self._streams.staged(node.login) and (failed := self._streams.stage(
                {node.login: render.framed("")}, STAGE_TIMEOUT_S, head)):
            raise RuntimeError(failed[node.login])
        return self._streams.start(node.login, _stream_command(), render.framed(node.script))

    def run(self, host: str, script: str, timeout: float) -> tuple[int, str]:
        # The script's own session, on the host's stream connection
        return self._streams.run(host, bootstrap_command(merge_stderr=True), render.framed(script), timeout)

    def drop_logs(self, dirs: dict[str, list[str]]) -> None:
        drop_logs_by_run(self.run, dirs)

    def rsync_shell(self, host: str) -> tuple[str, str]:
        """(rsync's -e command, the host name) for a copy to host over the run's connection."""
        return self._streams.shell(host)

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._streams.close()

    def _add_stream(self, host: str) -> None:
        # The `ssh` children read the known_hosts files paramiko reads for the host (and its jump host)
        jump = None
        if self._ssh.jump_host:
            jump = (login_addr(self._ssh.jump_host), self._known_for(host, jump=True))
        addr = login_addr(host)
        port = addr.port or (self._ssh.port if "port" in self._ssh.model_fields_set else None)
        self._streams.add(host, addr, port, self._known_for(host), jump)

    def _known_for(self, host: str, jump: bool = False) -> list[str]:
        """The known_hosts files of host (or of its jump host): without an ssh_config that
        names UserKnownHostsFile, the default ones, and nothing of fabric is needed."""
        if self._ssh.known_hosts or not names_known_hosts(self._ssh):
            return self._known_files({})
        conn = self._connection(host)
        if jump:
            from fabric import Connection
            gateway = getattr(conn, "gateway", None)
            return self._known_files(gateway.ssh_config if isinstance(gateway, Connection) else {})
        return self._known_files(conn.ssh_config)

    def _open_all(self, conns: dict) -> list[Problem]:
        if not conns:
            return []
        with ThreadPoolExecutor(max_workers=min(32, len(conns))) as pool:
            results = list(pool.map(lambda h: self._open(h, conns[h]), conns))
        return [p for p in results if p is not None]

    def _open(self, host: str, conn) -> Problem | None:
        from .ssh_paramiko import KEEPALIVE_S, explain_connect_error, set_user_timeout
        try:
            conn.open()
        except Exception as e:  # each failure becomes a per-host line, never a traceback
            conn.close()
            return Problem(f"host {host}", explain_connect_error(e, login_addr(host), self._ssh))
        transport = conn.client.get_transport()
        transport.set_keepalive(KEEPALIVE_S)
        set_user_timeout(transport.sock)
        self._conns[host] = conn
        return None

    def _connection(self, login: str):
        """login's fabric Connection (made once; not opened): what it reads of ssh_config and
        known_hosts, and the login that explains a failure. fabric's Connection() writes into
        the Config it is given, one shared by all hosts here, and another thread reading it
        meanwhile finds it empty (64 hosts did): each is made in turn, in one thread."""
        if login not in self._made:
            self._made[login] = self._make_connection(login)
        return self._made[login]

    def _fabric_config(self):
        if self._config is None:
            from fabric import Config
            path = os.path.expanduser(self._ssh.config_file) if self._ssh.config_file else None
            self._config = Config(runtime_ssh_path=path) if path else Config()
        return self._config

    def _make_connection(self, login: str):
        from fabric import Connection
        from .ssh_paramiko import TAKES_FACTORY, aead_first_transport
        s, config, addr = self._ssh, self._fabric_config(), login_addr(login)
        # No longer than connect_timeout for the banner either (paramiko's own is 15 s)
        kwargs: dict = {"allow_agent": True, "banner_timeout": s.connect_timeout}
        if TAKES_FACTORY:
            kwargs["transport_factory"] = aead_first_transport
        if s.key_file:
            kwargs["key_filename"] = [os.path.expanduser(s.key_file)]
        # The jump host authenticates with the same key and host-key policy as the nodes.
        gateway = Connection(s.jump_host, config=config, connect_timeout=s.connect_timeout,
                             connect_kwargs=dict(kwargs)) if s.jump_host else None
        # Host, user and port are passed apart: fabric's own "user@host:port" parsing refuses
        # a user given both ways. Validation already made the host's agree with cluster.ssh.
        port = addr.port or (s.port if "port" in s.model_fields_set else None)
        conn = Connection(addr.name, user=addr.user or s.user, port=port,
                          config=config, gateway=gateway, connect_timeout=s.connect_timeout,
                          connect_kwargs=kwargs)
        self._host_keys(conn.client, conn.ssh_config)
        if gateway is not None:
            self._host_keys(gateway.client, gateway.ssh_config)
        return conn

    def _host_keys(self, client, ssh_config: dict) -> None:
        import paramiko
        # fabric's default policy accepts any key; ours refuses unknown ones unless told otherwise.
        strict = self._ssh.strict_host_keys
        client.set_missing_host_key_policy(paramiko.RejectPolicy() if strict else paramiko.WarningPolicy())
        # One parsed copy per set of files, read by every client (connect only looks keys up):
        # paramiko's load checks each line against all before it, a class made per check, and
        # per client it grew with the hosts (bench/results/logpath-*).
        files = tuple(self._known_files(ssh_config))
        if files not in self._parsed:
            self._parsed[files] = paramiko.HostKeys()
            for path in files:
                if os.path.exists(path):
                    self._parsed[files].load(path)
        client._host_keys = self._parsed[files]   # what get_host_keys() returns

    def _known_files(self, ssh_config: dict) -> list[str]:
        """The known_hosts files for a host: cluster.ssh.known_hosts, else ssh_config's, else ~/.ssh/known_hosts."""
        files = [self._ssh.known_hosts] if self._ssh.known_hosts else []
        files += ssh_config.get("userknownhostsfile", "").split() if not files else []
        return [os.path.expanduser(f) for f in files or ["~/.ssh/known_hosts"]]


def ssh_config_files(ssh: SSH) -> list[str]:
    """The ssh_config files fabric reads for cluster.ssh: its config_file alone, else the
    user's and the system's."""
    if ssh.config_file:
        return [os.path.expanduser(ssh.config_file)]
    return [os.path.expanduser("~/.ssh/config"), "/etc/ssh/ssh_config"]


# paramiko's own reading of a setting (paramiko/config.py): the stripped line's first word,
# then blanks or "=", the word compared in lower case; a comment starts with # and has none
_SETTING = re.compile(r"(\w+)(?:\s*=\s*|\s+)")


def names_known_hosts(ssh: SSH) -> bool:
    """Whether an ssh_config file read for cluster.ssh may name UserKnownHostsFile (then fabric
    reads which, per host); a config_file that is missing, too (fabric's Config says so). A
    commented line names nothing: Debian's stock /etc/ssh/ssh_config has one, and reading it as
    a setting imported fabric before every login."""
    for path in ssh_config_files(ssh):
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:   # text, as fabric reads it
                if any(_names_known(line) for line in fh):
                    return True
        except FileNotFoundError:
            if ssh.config_file:
                return True
        except OSError:
            return True
    return False


def _names_known(line: str) -> bool:
    m = _SETTING.match(line.strip())
    return bool(m) and m.group(1).lower() == "userknownhostsfile"


def relay_head(python: str, config: dict) -> bytes:
    """What a session under the relay waits for before its stage frame: the interpreter that
    runs the relay (templates/rbootstrap.sh.j2), then the relay's config frame."""
    if "\n" in python:
        raise UserError(f"cluster.python {python!r} holds a line break")
    return python.encode() + b"\n" + render.relay_frame(config)


def _stream_command() -> str:
    return "exec /bin/sh -c " + shlex.quote(render.relayed_bootstrap(
        _relay(), merge_stderr=True, ready=READY.decode(), staged=STAGED.decode()))


def bootstrap_command(merge_stderr: bool = False, ready: str = "", staged: str = "") -> str:
    """What sshd's login shell runs: POSIX sh with the fixed bootstrap, whatever that shell is."""
    return "exec /bin/sh -c " + shlex.quote(render.bootstrap(merge_stderr, ready, staged))


@functools.cache
def _relay() -> str:
    return nodeprog.source("relay")

"""Node output streams through the OpenSSH client: one `ssh` process per node, which decrypts
in C in its own process and writes a file that the launcher moves into the node log unread
(transport/spool.py, session/nodeoutput.py). Each stream client is the master of its host's
connection: the short scripts (staging, checks, the teardown) ride it as sessions of their own
`ssh` children. Each client checks the host key against the known_hosts files paramiko would
read for the host, under the same policy (strict: a known key only; else an unknown key is
accepted into a file of the run's own, a changed one refused). paramiko only explains a login
that failed (transport/ssh_paramiko.py)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from .. import render
from ..errors import Problem
from ..spec import SSH
from ..spec.hosts import HostAddr
from .base import LOST
from .openssh_running import ACCEPTED, ALIVE_COUNT, ALIVE_S, OpenSSHRunning
from .spool import Spool

# Known to every OpenSSH since 6.5; the AEAD ciphers first
CIPHERS = ("aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,"
           "aes128-ctr,aes192-ctr,aes256-ctr")
END_GRACE_S = 5.0   # a session ended before its script: this long to finish its login first
READY = b"mlaunch-session-ready"   # the session's first line (templates/rbootstrap.sh.j2)
STAGED = b"mlaunch-session-staged"   # the session ran its stage frame (templates/stage_step.sh.j2)
NO_WARM = b"0\n"   # an empty warm frame (templates/stage_step.sh.j2): the session starts nothing ahead
WAIT_POLL_S = 0.01   # a ready or staged line is looked for at least this often
# run()'s answer for a host whose node session stopped hearing from it (OpenSSHRunning.silent)
SILENT = ("not tried: the host stopped answering ssh keepalives (frozen, or its link is down); "
          "its node's hang-up guard ends what is left there")
# ssh's words when connect() failed: "ssh: connect to host H port P: <strerror>"
CONNECT_FAILED = re.compile(r"^ssh: connect to host .* port (\d+): (.+)$")
# a host whose handshake never came (no banner): ssh's and paramiko's fix alike
NO_SSHD = ("the machine takes connections but its sshd does not answer (frozen or overloaded): "
           "check it, or raise cluster.ssh.connect_timeout")
SOCKET_DIR_MAX = 60   # a control socket's path (dir/N.S, and ssh's 17-byte temporary suffix) fits sun_path


class OpenSSHStreams:
    """Each host's `ssh` session (the master of its connection) and the short scripts that
    ride it; host keys checked as paramiko checks them."""

    def __init__(self, ssh: SSH):
        self._ssh = ssh
        self._dir = _private_dir()   # 0700: the keys accepted this run, the control sockets
        self._control: dict[str, str] = {}   # login -> its sockets' stem (add()); none: no sharing
        self._masters: dict[str, tuple[subprocess.Popen, str]] = {}   # login -> newest master, its socket
        self._serial = 0   # numbers each master's socket
        self._staged: set[str] = set()   # logins whose waiting session ran its stage frame
        self._warmed: set[str] = set()   # logins whose waiting session has its relay head and warm frame
        self._first: dict[str, bytes] = {}   # login -> relay head and warm frame, sent once it is logged in
        self._accepted = os.path.join(self._dir, "known_hosts")
        self._argv: dict[str, list[str]] = {}
        self._pending: dict[str, tuple[subprocess.Popen, Spool]] = {}   # logging in
        self._ready: dict[str, tuple[subprocess.Popen, Spool]] = {}   # logged in, no script yet
        self._started: dict[str, OpenSSHRunning] = {}   # login -> its node's session (start())
        self.unreached: set[str] = set()   # logins whose client never reached sshd: its words are the cause

    def add(self, login: str, addr: HostAddr, port: int | None, known: list[str],
            jump: tuple[HostAddr, list[str]] | None) -> None:
        """Remember how to reach login: its address, port, known_hosts files, jump host."""
        proxy = None
        if jump is not None:
            jaddr, jknown = jump
            argv = self._options(jaddr.user or self._ssh.user, jaddr.port, None, jknown)
            # ProxyCommand expands %-tokens: a literal % in a path is written %%
            proxy = render.command_line([*(a.replace("%", "%%") for a in argv), "-W", "%h:%p",
                                         "--", jaddr.name.replace("%", "%%")])
        self._argv[login] = [*self._options(addr.user or self._ssh.user, port, proxy, known), "--", addr.name]
        self._control[login] = os.path.join(self._dir, str(len(self._control)))

    def spawn(self, command: str) -> None:
        """Begin the logins of every known host that has no session waiting; command then
        waits there for its script (and, where it runs one, a stage frame first)."""
        for login in self._argv:
            if login not in self._ready and login not in self._pending:
                self._pending[login] = self._popen(login, command)

    def await_ready(self, timeout: float) -> dict[str, Problem]:
        """Wait for every login spawn() began; by login, a line for each that failed (then
        every waiting session is ended: nothing of the job is sent anywhere, and a warm start
        already under way ends with its session)."""
        logins = list(self._pending)
        with ThreadPoolExecutor(max_workers=min(64, len(logins) or 1)) as pool:
            results = dict(zip(logins, pool.map(lambda h: self._await(h, timeout), logins)))
        problems = {h: p for h, p in results.items() if p is not None}
        if problems:
            self.end_sessions()
        return problems

    def warm(self, frames: dict[str, bytes], relay_head: bytes) -> None:
        """Send each waiting session relay_head and its warm frame (templates/warm.sh.j2), which
        its shell runs before it reads its stage frame; nothing is read back: a session that
        ended says so at its stage. A host not logged in yet gets them the moment it is
        (await_ready): each node's imports begin without waiting for the slowest login."""
        for login, frame in frames.items():
            if login in self._ready and login not in self._warmed:
                self._send_warm(login, relay_head + frame)
            elif login not in self._warmed:
                self._first[login] = relay_head + frame

    def _send_warm(self, login: str, data: bytes) -> None:
        try:
            self._ready[login][0].stdin.write(data)
            self._ready[login][0].stdin.flush()
        except BrokenPipeError:
            pass
        self._warmed.add(login)

    def stage(self, frames: dict[str, bytes], timeout: float, relay_head: bytes) -> dict[str, str]:
        """Send each waiting session relay_head (the relay's interpreter and config), then its
        stage frame (templates/stage_step.sh.j2); by login, the last words of each whose stage
        failed (its session has ended)."""
        with ThreadPoolExecutor(max_workers=min(64, len(frames) or 1)) as pool:
            said = dict(zip(frames, pool.map(lambda h: self._await_staged(h, frames[h], timeout, relay_head),
                                             frames)))
        return {h: words for h, words in said.items() if words is not None}

    def staged(self, login: str) -> bool:
        """Whether login's waiting session has run its stage frame."""
        return login in self._staged

    def start(self, login: str, command: str, script: bytes) -> OpenSSHRunning:
        """The node's session (spawn()'s, staged: its relay head went with the stage frame):
        script goes ahead of the heartbeats."""
        if login not in self._ready:
            self._pending.setdefault(login, self._popen(login, command))
            if problem := self._await(login, self._ssh.connect_timeout + 10):
                raise RuntimeError(problem.message)
        proc, spool = self._ready.pop(login)
        self._staged.discard(login)
        self._warmed.discard(login)
        try:
            proc.stdin.write(script)
            proc.stdin.flush()
        except BrokenPipeError:
            pass   # the client already ended: wait() tells how
        self._started[login] = OpenSSHRunning(proc, spool)
        return self._started[login]

    def run(self, login: str, command: str, data: bytes, timeout: float) -> tuple[int, str]:
        """command on login's host with data on its stdin, over its stream client's connection
        where one is open (else a login of its own): (exit code, output). The client's own
        stderr is the output only where the client failed. Not tried where the node's session
        found the host silent: a login there would only wait out ConnectTimeout."""
        if (node := self._started.get(login)) is not None and node.silent:
            return LOST, SILENT
        master = self._masters.get(login)
        sharing = self._control_argv(master[1], False) if master and master[0].poll() is None else []
        proc = self._client(login, sharing, command, subprocess.PIPE)
        try:
            out, said = proc.communicate(data, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return LOST, f"no answer within {timeout:g}s"
        text = out.decode("utf-8", "replace")
        if proc.returncode == LOST:   # 255: the client's words say why (or the script's own exit)
            text += "".join(ln for ln in said.decode("utf-8", "replace").splitlines(True)
                            if not ln.startswith(ACCEPTED))
        return proc.returncode, text

    def shell(self, login: str) -> tuple[str, str]:
        """(the ssh command, the host) that another program (rsync -e) reaches login with:
        this run's client options, riding the host's stream connection where one is open."""
        master = self._masters.get(login)
        sharing = self._control_argv(master[1], False) if master and master[0].poll() is None else []
        argv = self._argv[login]
        cut = len(argv) - 1 - argv[::-1].index("--")
        return render.command_line([argv[0], *sharing, *argv[1:cut]]), argv[cut + 1]

    def end_sessions(self) -> None:
        """End sessions begun but never started: their stdin closes, so each ends on the node
        once its login is done; killed only past END_GRACE_S (a login cut half-way can leave a
        node's shell start-up undone, e.g. a stale pyenv rehash lock)."""
        procs = [*(p[0] for p in self._pending.values()), *(r[0] for r in self._ready.values())]
        self._pending.clear()
        self._ready.clear()
        self._staged.clear()
        self._warmed.clear()
        self._first.clear()
        for proc in procs:
            try:
                proc.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + END_GRACE_S
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        self.end_sessions()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _client(self, login: str, sharing: list[str], command: str, stdout) -> subprocess.Popen:
        # A session of its own: the terminal's Ctrl-C reaches the launcher, which tears down
        # in order, and never the clients (they would drop every node's output at once).
        argv = self._argv[login]
        return subprocess.Popen([argv[0], *sharing, *argv[1:], command], stdin=subprocess.PIPE,
                                stdout=stdout, stderr=subprocess.PIPE, start_new_session=True)

    def _popen(self, login: str, command: str) -> tuple[subprocess.Popen, Spool]:
        sharing, path = [], None
        if login in self._control:   # a socket of its own: an older master may still be ending
            path = f"{self._control[login]}.{self._serial}"
            self._serial += 1
            sharing = self._control_argv(path, True)
        spool = Spool(self._dir)
        proc = self._client(login, sharing, command, spool.fd)
        if path is not None:
            self._masters[login] = (proc, path)
        return proc, spool

    def _await(self, login: str, timeout: float) -> Problem | None:
        proc, spool = self._pending.pop(login)
        seen, cut, timed_out = _read_until(proc, spool, lambda b: _line_at(b, READY), timeout)
        if cut is None:
            self._first.pop(login, None)
            return self._refused(login, proc, timeout if timed_out else None)
        self.unreached.discard(login)
        end = seen.index(b"\n", cut) + 1
        spool.give_back(len(seen) - end)   # the node's first bytes, where they came with it
        self._ready[login] = (proc, spool)
        if (first := self._first.pop(login, None)) is not None:   # in this host's own thread
            self._send_warm(login, first)
        return None

    def _await_staged(self, login: str, frame: bytes, timeout: float, relay_head: bytes) -> str | None:
        proc, spool = self._ready[login]
        head = b"" if login in self._warmed else relay_head + NO_WARM   # its warm frame went first
        try:   # in this host's own thread: a client slow to take it holds up no other host
            proc.stdin.write(head + frame)
            proc.stdin.flush()
        except BrokenPipeError:
            pass   # the session ended: its words tell why
        seen, cut, timed_out = _read_until(proc, spool, lambda b: _line_at(b, STAGED), timeout)
        if cut is not None:
            spool.give_back(len(seen) - cut - len(STAGED) - 1)
            self._staged.add(login)
            return None
        del self._ready[login]
        self._warmed.discard(login)
        code, words = _ended(proc, seen)
        return f"no answer in {timeout:g}s" if timed_out else (words[-1] if words else f"exit {code}")

    def _refused(self, login: str, proc: subprocess.Popen, timed_out: float | None) -> Problem:
        code, said = _ended(proc)
        if not timed_out and (why := unreached_line(said, max(1, round(self._ssh.connect_timeout)))):
            self.unreached.add(login)
            return Problem(f"host {login}", why)
        what = f"had no answer in {timed_out:g}s" if timed_out else \
            "cannot log in where paramiko did: " + (said[-1] if said else f"exit {code}")
        return Problem(f"host {login}", f"the OpenSSH client (ssh) {what}; fix ssh_config or the "
                       "key for this host")

    @staticmethod
    def _control_argv(path: str, master: bool) -> list[str]:
        return render.ssh_control_argv(_config_path(path), master)

    def _options(self, user: str | None, port: int | None, proxy: str | None, known: list[str]) -> list[str]:
        s = self._ssh
        # Not strict: a new key goes to the run's own file, the first one named (never the
        # user's), as paramiko's WarningPolicy writes none
        files = known if s.strict_host_keys else [self._accepted, *known]
        return render.ssh_client_argv(
            alive_s=ALIVE_S, alive_count=ALIVE_COUNT, ciphers=CIPHERS, connect_timeout=max(1, round(s.connect_timeout)),
            known_hosts=" ".join(_config_path(f) for f in files), strict=s.strict_host_keys,
            config_file=os.path.expanduser(s.config_file) if s.config_file else None,
            key_file=os.path.expanduser(s.key_file) if s.key_file else None, user=user, port=port, proxy=proxy)


def unreached_line(said: list[str], timeout_s: int) -> str | None:
    """One line (cause; fix) where the client's words say it never reached the host's sshd (no
    route, refused, no answer, no banner, no such name), in ssh's own words; None for anything
    else (a refused key, a login that failed: paramiko explains those)."""
    for line in reversed(said):
        if "during banner exchange" in line:
            return f"no SSH banner in {timeout_s}s (ssh: {line}); {NO_SSHD}"
        if (m := CONNECT_FAILED.match(line)) and m.group(2) == "Connection refused":
            return refused_line(m.group(1))
        if m:
            return f"{line}; {unreached_fix(m.group(2), m.group(1), timeout_s)}"
        if "Could not resolve hostname" in line:
            return f"{line}; fix the name in cluster.hosts or ssh_config, or add it to DNS or /etc/hosts"
    return None


def refused_line(port: int | str) -> str:
    """The line for a host that refused the connection (nothing listens on the port)."""
    return f"connection refused on port {port}: is sshd running there and the port open?"


def unreached_fix(cause: str, port: int | str, timeout_s: int) -> str:
    """The fix for a connect() that failed with cause (strerror's words), ssh's or paramiko's."""
    if cause == "No route to host":
        return "the machine is down or not on this network: check that it is up and reachable from here"
    if cause == "Connection timed out":
        return (f"no answer in {timeout_s}s: the machine is down or port {port} is firewalled: check "
                "it, or raise cluster.ssh.connect_timeout")
    return f"check that the machine is up and port {port} is reachable from here"


def _line_at(seen: bytes, line: bytes) -> int | None:
    """Where line starts in seen once it is whole and a line of its own, else None."""
    at = seen.find(line + b"\n")
    while at > 0 and seen[at - 1:at] != b"\n":   # not the end of another line
        at = seen.find(line + b"\n", at + 1)
    return None if at < 0 else at


def _read_until(proc: subprocess.Popen, spool: Spool, find, timeout: float) -> tuple[bytes, int | None, bool]:
    """Read proc's output until find(what was read) is not None: (what was read, where,
    whether the time ran out first); where is None when the client ended or time ran out."""
    deadline, seen = time.monotonic() + timeout, b""
    while (cut := find(seen)) is None:
        chunk = spool.read(proc, deadline, WAIT_POLL_S)
        if not chunk:
            return seen, None, proc.poll() is None
        seen += chunk
    return seen, cut, False


def _ended(proc: subprocess.Popen, seen: bytes = b"") -> tuple[int, list[str]]:
    """A client that failed, ended: its exit code and its words (seen, then its stderr)."""
    if proc.poll() is None:
        proc.kill()
    code = proc.wait()
    text = (seen + proc.stderr.read()).decode("utf-8", "replace").strip()
    return code, [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(ACCEPTED)]


def _private_dir() -> str:
    """A new 0700 directory: in the temporary directory unless its path is too long for the
    control sockets, then in /tmp."""
    path = tempfile.mkdtemp(prefix="mlaunch-ssh-")
    if len(path) <= SOCKET_DIR_MAX:
        return path
    os.rmdir(path)
    return tempfile.mkdtemp(prefix="mlaunch-ssh-", dir="/tmp")


def _config_path(path: str) -> str:
    """path as one ssh_config word: %-tokens doubled, quoted where it holds a blank."""
    path = path.replace("%", "%%")
    return f'"{path}"' if any(c.isspace() for c in path) else path

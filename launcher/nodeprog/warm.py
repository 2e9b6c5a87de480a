"""A node's torchrun, started warm (templates/warm.sh.j2, templates/node.sh.j2): run on
torchrun's own interpreter while the launcher still checks the nodes, it imports what torchrun
imports first (torch with its elastic agent, seconds of CPU per node), then holds until the
node's script hands it the launch; then it runs torchrun's `main` in this process, as the
torchrun command would. Nothing of the job runs before the hand-off: no rendezvous, no port.

argv: the hold directory (0700, the node's shell made it), the pid of the shell that
started it, torchrun's path (or `-m`: the node runs `python -m torch.distributed.run`).

The hand-off: the script writes `argv` (its cwd, the signals its shell ignores, then
torchrun's argv, NUL-separated) and `env.part` (`env -0`), sends SIGUSR1 where this process
said `ready` (from then on the signal is blocked: it cannot end the process), and only then
renames `env` into place. So by the time `env` is there, any signal of the hand-off has been
sent, and is taken here before the signal is unblocked (a script that came before `ready`
sends none and is found by its `env`).

The warm start is taken only where torchrun would start as the script would start it: the
environment (any change beside the names in SAME_AFTER: a cluster.setup line that loads a
module, a changed PYTHONPATH), the working directory, and what a cluster.setup line can
change in the shell that a child inherits (resource limits, umask, niceness, CPU affinity,
cgroup, OOM score, where stdout and stderr go) are as at its start. Any change declines it
(exit 0), and the script starts torchrun itself. `taken` says that torchrun runs
here; it gets the signal dispositions a child of the shell would get, and torchrun's name.

The launcher never sends the script (a failed check, Ctrl-C): the shell that started this
ends, and so does this process, with its hold directory (PR_SET_PDEATHSIG's SIGTERM; a look
at the parent's pid covers the moment before it was set). A SIGTERM before the hand-off is
taken (a teardown) ends this process with 128 + the signal, and then the script starts nothing.
Standard library only, besides torch itself.
"""
import sys

# `python -c` searches the working directory first; torchrun does not (its own directory, or
# the working directory for `python -m`, main() puts back): no file of the job's directory
# may stand in for a module imported here
CWD_FIRST = bool(sys.path) and sys.path[0] == ""
if CWD_FIRST:
    del sys.path[0]

import os  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402

SAME_AFTER = ("NCCL_", "GLOO_", "TORCHELASTIC_", "MASTER_ADDR", "MASTER_PORT")
IGNORED = ("_", "PWD", "OLDPWD", "SHLVL")
HOLD_S = 3600.0   # no hand-off in this long: the launcher is gone without closing the session
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
HANDED_S = 0.001   # signalled: the script's `env` follows at once; looked for this often
# /proc/<pid>/status lines a child inherits, compared with the shell's at the hand-off
INHERITED_STATUS = ("Umask",)


def _die_with_parent(hold, parent):
    """SIGTERM (the parent's end, a teardown) removes the hold directory and ends this
    process, until it is taken."""
    def end(signum, frame):
        _remove(hold)
        os._exit(128 + signum if signum else 0)   # the script starts nothing after a teardown's signal
    signal.signal(signal.SIGTERM, end)
    _pdeathsig(signal.SIGTERM)
    if os.getppid() != parent:
        end(0, None)


def _pdeathsig(sig):
    try:
        import ctypes
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(sig))
    except (OSError, AttributeError):
        pass   # not Linux: the wait for the hand-off still looks at the parent


def _remove(hold):
    """The hold directory, whatever it holds by now (`env.part` of a script cut short)."""
    try:
        names = os.listdir(hold)
    except OSError:
        names = []
    for name in names:
        try:
            os.unlink(os.path.join(hold, name))
        except OSError:
            pass
    try:
        os.rmdir(hold)
    except OSError:
        pass


def _quiet(hold):
    """Output of the imports to a file, replayed once taken (before that, the node's output
    is the launcher's staging exchange)."""
    saved = (os.dup(1), os.dup(2))
    fd = os.open(os.path.join(hold, "imports.out"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return saved


def _loud(hold, saved):
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    with open(os.path.join(hold, "imports.out"), "rb") as fh:
        said = fh.read()
    if said:
        os.write(2, said)


def _await_go(hold, parent):
    """True once the script handed off (its `env` is there: it may have come before `ready`,
    without a signal); False where the parent ended or the hold ran out."""
    waited, step, go = 0.0, 0.5, os.path.join(hold, "env")
    while not os.path.exists(go):
        if waited >= HOLD_S or os.getppid() != parent:
            return False
        if signal.sigtimedwait([signal.SIGUSR1], step) is not None:
            step = HANDED_S   # the script signals before it renames `env` into place
        waited += step
    signal.sigtimedwait([signal.SIGUSR1], 0)   # sent before `env` was there: none is left pending
    return True


def _read(hold, name):
    """A NUL-separated file of the hand-off, removed once read (the environment holds secrets)."""
    path = os.path.join(hold, name)
    with open(path, "rb") as fh:
        data = fh.read()
    os.unlink(path)
    return [os.fsdecode(f) for f in data.split(b"\0")[:-1]]


def _declined(before, env):
    """The names an import may read that changed between the start and the hand-off."""
    names = set(before) | set(env)
    return sorted(n for n in names if before.get(n) != env.get(n)
                  and n not in IGNORED and not n.startswith(SAME_AFTER))


def _started_with():
    """The environment this process was started with (os.environ holds what Python added)."""
    try:
        with open("/proc/self/environ", "rb") as fh:
            return dict(os.fsdecode(e).split("=", 1) for e in fh.read().split(b"\0") if b"=" in e)
    except OSError:
        return dict(os.environ)


def _state(pid):
    """What a child of pid inherits that a cluster.setup line can change, by name."""
    out = {}
    try:
        with open(f"/proc/{pid}/limits") as fh:
            for line in fh.read().splitlines()[1:]:
                out[line[:26].strip().lower()] = line[26:].split()[:2]
        with open(f"/proc/{pid}/status") as fh:
            out.update({k: v.strip() for k, _, v in (ln.partition(":") for ln in fh)
                        if k in INHERITED_STATUS})
        with open(f"/proc/{pid}/cgroup") as fh:
            out["cgroup"] = fh.read()
        with open(f"/proc/{pid}/oom_score_adj") as fh:
            out["OOM score"] = fh.read().strip()
        out["niceness"] = os.getpriority(os.PRIO_PROCESS, pid)
        out["CPU affinity"] = sorted(os.sched_getaffinity(pid))
    except (OSError, AttributeError) as e:   # not what this start can compare: it declines
        out["its own state (" + type(e).__name__ + ")"] = pid
    return out


def _outputs(pid, saved):
    """Where pid's stdout and stderr go, and where this process's saved ones do."""
    try:
        theirs = [os.stat(f"/proc/{pid}/fd/{fd}") for fd in (1, 2)]
        ours = [os.fstat(fd) for fd in saved]
    except OSError:
        return ["stdout or stderr"]
    return [name for name, a, b in zip(("stdout", "stderr"), theirs, ours)
            if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino)]


def _shell_changed(parent, saved):
    """What the shell changed since this process started that torchrun would inherit."""
    mine, theirs = _state(os.getpid()), _state(parent)
    return sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k)) + _outputs(parent, saved)


def _as_a_child(ignored):
    """The signal dispositions torchrun gets from the shell's exec: what the shell ignores
    stays ignored, the rest default; and what Python's own start sets (SIGINT's
    KeyboardInterrupt where the shell did not ignore it; SIGPIPE and SIGXFSZ ignored). A
    background job of sh starts with SIGINT and SIGQUIT ignored: torchrun's do not."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        if ignored >> (sig - 1) & 1 or sig in (signal.SIGPIPE, signal.SIGXFSZ):
            how = signal.SIG_IGN
        else:
            how = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
        try:
            signal.signal(sig, how)
        except (OSError, ValueError, RuntimeError):
            pass   # glibc's own (32, 33): not the shell's to set either


def _name(torchrun):
    """The process's name as the torchrun command's (`ps -o comm`, pgrep): its file's."""
    if torchrun != "-m":
        try:
            import ctypes
            ctypes.CDLL(None).prctl(PR_SET_NAME, os.path.basename(torchrun).encode()[:15])
        except (OSError, AttributeError):
            pass


def _touch(hold, name):
    os.close(os.open(os.path.join(hold, name), os.O_WRONLY | os.O_CREAT, 0o600))


def main():
    began = time.monotonic()
    hold, parent, torchrun = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    _touch(hold, "ready")   # the signal waits from now on, also while the imports run
    _die_with_parent(hold, parent)
    os.setpgid(0, 0)   # its own group, as the torchrun the script would exec: the teardown signals it
    before = _started_with()
    saved = _quiet(hold)
    start_cwd = os.getcwd()
    # sys.path as the command would have it: torchrun's directory, or the cwd for `python -m`
    if CWD_FIRST:
        sys.path.insert(0, start_cwd if torchrun == "-m" else os.path.dirname(torchrun))
    import torch.distributed.run as module
    torchrun_main = module.main
    took = time.monotonic() - began
    if not _await_go(hold, parent):
        _remove(hold)
        os._exit(0)
    try:
        cwd, ignored, *argv = _read(hold, "argv")
        int(ignored, 16)   # the shell's ignored signals, as /proc says them: else it declines
        env = dict(e.split("=", 1) for e in _read(hold, "env") if "=" in e)
        changed = (_declined(before, env) + (["the working directory"] if cwd != start_cwd else [])
                   + _shell_changed(parent, saved))
    except Exception as e:   # a hand-off this program cannot read: the script starts torchrun itself
        changed = [f"the hand-off ({type(e).__name__}: {e})"]
    if changed:
        _loud(hold, saved)
        print("mlaunch: torchrun starts cold: what it would inherit changed after its warm start ("
              + ", ".join(changed[:5]) + ")", file=sys.stderr, flush=True)
        os._exit(0)
    os.chdir(cwd)
    added = {k: v for k, v in os.environ.items() if k not in before and k not in env}
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(added)   # what Python adds at its start (PEP 538's LC_CTYPE), as a cold start has it
    _touch(hold, "taken")
    _pdeathsig(0)   # torchrun now: it ends as the torchrun command would, by the teardown's signals
    _as_a_child(int(ignored, 16))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR1])   # its ranks inherit the mask
    _name(torchrun)
    _loud(hold, saved)
    print(f"mlaunch: torchrun started warm: its imports took {took:.1f}s during the launcher's checks",
          file=sys.stderr, flush=True)
    sys.argv = [module.__file__, *argv[3:]] if torchrun == "-m" else [torchrun, *argv[1:]]
    sys.exit(torchrun_main())


main()

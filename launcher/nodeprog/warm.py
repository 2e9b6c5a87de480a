"""A node's torchrun, started warm (templates/warm.sh.j2, templates/node.sh.j2): run on
torchrun's own interpreter while the launcher still checks the nodes, it imports what torchrun
imports first (torch with its elastic agent, seconds of CPU per node), then holds until the
node's script hands it the launch; then it runs torchrun's `main` in this process, as the
torchrun command would. Nothing of the job runs before the hand-off: no rendezvous, no port.

argv: the hold directory (0700, the node's shell made it), the pid of the shell that
started it, torchrun's path (or `-m`: the node runs `python -m torch.distributed.run`).

The hand-off: the script writes `argv` (its cwd, then torchrun's argv, NUL-separated), then
`env` (`env -0`, renamed into place whole), then sends SIGUSR1 where this process said
`ready` (from then on the signal is blocked: it cannot end the process; a script that came
earlier is found by its `env`). The warm start is taken only where the environment an import
reads is the one it started with: any change beside the names in SAME_AFTER (a
cluster.setup line that loads a module, a changed PYTHONPATH) declines it, and the script
starts torchrun itself. `taken` says that torchrun runs here.

The launcher never sends the script (a failed check, Ctrl-C): the shell that started this
ends, and so does this process, with its hold directory (PR_SET_PDEATHSIG's SIGTERM; a look
at the parent's pid covers the moment before it was set). Standard library only, besides
torch itself.
"""
import os
import signal
import sys
import time

SAME_AFTER = ("NCCL_", "GLOO_", "TORCHELASTIC_", "MASTER_ADDR", "MASTER_PORT")
IGNORED = ("_", "PWD", "OLDPWD", "SHLVL")
HOLD_S = 3600.0   # no hand-off in this long: the launcher is gone without closing the session
PR_SET_PDEATHSIG = 1


def _die_with_parent(hold, parent):
    """SIGTERM (the parent's end, a teardown) removes the hold directory and ends this
    process, until it is taken."""
    def end(signum, frame):
        _remove(hold)
        os._exit(0)
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
    for name in ("ready", "imports.out", "argv", "env", "taken"):
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
    waited, go = 0.0, os.path.join(hold, "env")
    while not os.path.exists(go):
        if waited >= HOLD_S or os.getppid() != parent:
            return False
        signal.sigtimedwait([signal.SIGUSR1], 0.5)
        waited += 0.5
    signal.sigtimedwait([signal.SIGUSR1], 0)   # a signal sent meanwhile, taken: none is left pending
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
    sys.path[0] = start_cwd if torchrun == "-m" else os.path.dirname(torchrun)
    import torch.distributed.run as module
    torchrun_main = module.main
    imported = time.monotonic()
    took = imported - began
    if not _await_go(hold, parent):
        _remove(hold)
        os._exit(0)
    cwd, *argv = _read(hold, "argv")
    env = dict(e.split("=", 1) for e in _read(hold, "env") if "=" in e)
    changed = _declined(before, env) + (["the working directory"] if cwd != start_cwd else [])
    if changed:
        _loud(hold, saved)
        print("mlaunch: torchrun starts cold: what an import reads changed after its warm start ("
              + ", ".join(changed[:5]) + ")", file=sys.stderr, flush=True)
        os._exit(0)
    os.chdir(cwd)
    added = {k: v for k, v in os.environ.items() if k not in before and k not in env}
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(added)   # what Python adds at its start (PEP 538's LC_CTYPE), as a cold start has it
    _touch(hold, "taken")
    _pdeathsig(0)   # torchrun now: it ends as the torchrun command would, by the teardown's signals
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR1])   # its ranks inherit the mask
    _loud(hold, saved)
    print(f"mlaunch: torchrun started warm: its imports took {took:.1f}s during the launcher's checks",
          file=sys.stderr, flush=True)
    sys.argv = [module.__file__, *argv[3:]] if torchrun == "-m" else [torchrun, *argv[1:]]
    sys.exit(torchrun_main())


main()

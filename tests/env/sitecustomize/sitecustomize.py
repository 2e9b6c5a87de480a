"""sitecustomize for the CPU trainer venv (installed by tests/env/make_trainer_venv.sh).

Problem: in CPU DDP (torchrun + gloo) accelerate/transformers set the training
device to ``torch.device("cpu", 0)``.  On resume, ``Trainer._load_optimizer_and_scheduler``
calls ``torch.load(..., map_location=self.args.device)``, i.e. location ``"cpu:0"``,
and torch's built-in CPU deserializer only accepts the exact tag ``"cpu"``::

    RuntimeError: don't know how to restore data location of
    torch.storage.UntypedStorage (tagged with cpu:0)

Fix: register a torch.serialization deserializer for ``cpu:N`` locations.

Python imports ``sitecustomize`` at start-up in every interpreter of the venv
(so every torchrun worker gets it).  Importing torch here would slow down every
``python`` call (pip included), so the registration is done lazily by a
post-import hook that fires right after ``torch.serialization`` is executed.

Set ``TRAINER_VENV_NO_CPU_N_FIX=1`` to switch the fix off (to reproduce the error).

Second fix, exit-time SIGABRT of gloo workers ("terminate called without an active
exception", torchrun reports exitcode -6 for a rank AFTER training finished): a
``pt_gloo_runloop`` thread drops the last reference to a finished collective
(seen: ``~AsyncAllgatherWork``) whose output tensor still owns a Python object, so
it must take the GIL; if the main thread has meanwhile entered interpreter
finalization, CPython exits that thread with a forced unwind through a noexcept
frame and libstdc++ calls std::terminate.  In a torchrun worker (WORLD_SIZE > 1)
this module registers an atexit handler that, while the interpreter is still
fully alive, releases the GIL for a short grace period so such threads can finish
their clean-up first.  ``TRAINER_VENV_EXIT_GRACE_S`` sets the period (default 0.5,
0 switches it off).
"""

import os
import sys

# DeepSpeed JIT-builds its CPU shm op on first use under a lock file in
# ~/.cache/torch_extensions; a build killed half-way leaves the lock and every later run
# waits on it forever. This venv builds the op once, at creation, into its own folder.
# The venv is used through links (a checkout's .venvs/<name> -> the machine-wide cache
# entry, tests/env/venv_lib.sh): every path below, and every module's __file__, is the real
# one it was built at, so the op's build commands (which name include paths) never change.
_PREFIX = os.path.realpath(sys.prefix)
sys.path[:] = [os.path.realpath(p) if p.startswith(sys.prefix) else p for p in sys.path]
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(_PREFIX, "torch_extensions"))
# torch builds and checks that op with whatever `ninja` is first on PATH, and ninja 1.11
# (/usr/bin) and the venv's 1.13 hash build commands differently: one run without the venv
# on PATH (a test's own torchrun, not mlaunch's) made the next run rebuild the op, 25-65 s
# of both cores. So every process of the venv finds the venv's bin/ first, as mlaunch's
# workers do.
_BIN = os.path.join(_PREFIX, "bin")
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")

_TARGET = "torch.serialization"
_PRIORITY = 15  # after torch's own "cpu" (10), before cuda (20)


def _is_cpu_n(location):
    return isinstance(location, str) and location.startswith("cpu:") and location[4:].isdigit()


def _tag_none(obj):
    # Tagging at save time is left to torch's own taggers.
    return None


def _deserialize_cpu_n(obj, location):
    if _is_cpu_n(location):
        return obj  # storages are materialised on the CPU already
    return None


def _register(serialization):
    if getattr(serialization, "_tests_env_cpu_n_registered", False):
        return
    serialization.register_package(_PRIORITY, _tag_none, _deserialize_cpu_n)
    serialization._tests_env_cpu_n_registered = True


class _PostImportFinder:
    """Meta-path finder that wraps the loader of ``torch.serialization``."""

    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        inner_exec = loader.exec_module

        def exec_module(module, _inner=inner_exec):
            _inner(module)
            try:
                _register(module)
            finally:
                _uninstall()

        loader.exec_module = exec_module
        return spec


_FINDER = _PostImportFinder()


def _uninstall():
    try:
        sys.meta_path.remove(_FINDER)
    except ValueError:
        pass


def _exit_grace():
    if "torch.distributed" not in sys.modules:
        return
    import time

    time.sleep(_GRACE_S)  # releases the GIL: gloo worker threads can decref now


def _grace_seconds():
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        grace = float(os.environ.get("TRAINER_VENV_EXIT_GRACE_S", "0.5"))
    except ValueError:
        return 0.0
    return grace if world > 1 else 0.0


_GRACE_S = _grace_seconds()
if _GRACE_S > 0:
    import atexit

    # Registered first, so it runs last among atexit handlers, right before
    # finalization starts.
    atexit.register(_exit_grace)

if os.environ.get("TRAINER_VENV_NO_CPU_N_FIX", "") not in ("", "0"):
    pass
elif _TARGET in sys.modules:  # pragma: no cover - sitecustomize runs before any torch import
    _register(sys.modules[_TARGET])
else:
    sys.meta_path.insert(0, _FINDER)

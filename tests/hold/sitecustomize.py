"""Test-only start-up hook for the trainer processes of a test's job (on PYTHONPATH through
the spec's cluster.env; tests/training.py held_at). It runs the venv's own sitecustomize,
then, when MLAUNCH_TEST_HOLD_AT=N, holds each trainer process right after the Trainer has
saved checkpoint-N (its on_save callbacks, so after ms-swift's own additions too) until the
file MLAUNCH_TEST_HOLD_DIR/release exists; when MLAUNCH_TEST_EXIT_AT=N, ends rank 0 once
step N is logged (tests/training.py exits_at).

Why: a test that kills a worker once checkpoint-5 is saved raced the training: the tiny
model's steps 6-10 took 0.16 s, and under load the killer came after checkpoint-10 (loaded
run 24: the kill landed on a finished run, no restart). Held, the trainer cannot go on before
the kill: the test's outcome no longer depends on the machine's speed. Each process holds
once (a marker per rank), so a restart that saves step N again goes on.
"""
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _run_the_venvs_own() -> None:
    """Python imports the first sitecustomize on sys.path, this one: run the next one too."""
    for entry in sys.path:
        path = os.path.join(entry, "sitecustomize.py")
        if entry and os.path.abspath(entry) != _HERE and os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_venv_sitecustomize", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules["_venv_sitecustomize"] = module
            spec.loader.exec_module(module)
            return


def _hold(state) -> None:
    import time
    where = os.environ["MLAUNCH_TEST_HOLD_DIR"]
    marker = os.path.join(where, f"held-{state.global_step}-rank{os.environ.get('RANK', '0')}")
    if os.path.exists(marker):
        return
    open(marker, "w").close()
    while not os.path.exists(os.path.join(where, "release")):
        time.sleep(0.05)


def _patch(module) -> None:
    if os.environ.get("MLAUNCH_TEST_EXIT_AT"):
        _patch_exit(module, int(os.environ["MLAUNCH_TEST_EXIT_AT"]))
    if not os.environ.get("MLAUNCH_TEST_HOLD_AT"):
        return
    step = int(os.environ["MLAUNCH_TEST_HOLD_AT"])
    on_save = module.CallbackHandler.on_save

    def held_on_save(self, args, state, control):
        control = on_save(self, args, state, control)
        if state.global_step == step:
            _hold(state)
        return control

    module.CallbackHandler.on_save = held_on_save


def _patch_exit(module, step: int) -> None:
    """MLAUNCH_TEST_EXIT_AT=N: rank 0 ends with exit 1 right after step N has been logged, once
    per run (a marker in MLAUNCH_TEST_HOLD_DIR): a failure between two saves that no machine's
    speed can move past the next save."""
    on_log = module.CallbackHandler.on_log

    def exiting_on_log(self, args, state, control, logs):
        control = on_log(self, args, state, control, logs)
        marker = os.path.join(os.environ["MLAUNCH_TEST_HOLD_DIR"], f"exited-{step}")
        if state.global_step == step and os.environ.get("RANK", "0") == "0" and not os.path.exists(marker):
            open(marker, "w").close()
            # LLaMA-Factory writes trainer_log.jsonl on a thread of its LogCallback: the step's
            # line is written before the exit, however busy the machine (it was lost under load)
            for cb in getattr(self, "callbacks", ()):
                pool = getattr(cb, "thread_pool", None)
                if pool is not None:
                    pool.shutdown(wait=True)
            sys.stdout.flush()
            os._exit(1)
        return control

    module.CallbackHandler.on_log = exiting_on_log


class _AfterImport:
    """Patches transformers.trainer_callback once it has been executed (never imports it)."""
    name = "transformers.trainer_callback"

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        from importlib.util import find_spec
        spec = find_spec(name)
        inner = spec.loader.exec_module

        def exec_module(module):
            inner(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


_run_the_venvs_own()
if (os.environ.get("MLAUNCH_TEST_HOLD_AT") or os.environ.get("MLAUNCH_TEST_EXIT_AT")) and \
        os.environ.get("MLAUNCH_TEST_HOLD_DIR"):
    sys.meta_path.insert(0, _AfterImport())

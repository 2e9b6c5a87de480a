"""Stand-in ``torchaudio`` for the CPU trainer venv (tests/env/make_trainer_venv.sh).

LLaMA-Factory 0.9.5 does ``import torchaudio`` at module level in
``llamafactory/data/mm_plugin.py`` although only audio datasets use it.  PyPI has
no torchaudio build for torch 2.13.0 (torchaudio pins torch exactly), and the PyPI
torch{vision,audio} wheels are CUDA builds that break ``import transformers``
next to the CPU torch wheel.  Text-only training never calls into this module;
anything that does gets a clear error instead of a wrong result.

There is deliberately no ``*.dist-info`` for this package, so
``transformers.utils.is_torchaudio_available()`` stays False and transformers
never tries to use it.
"""

__version__ = "0.0.0+stub"
STUB = True

from . import functional  # noqa: E402,F401


def _unavailable(name):
    def _fn(*args, **kwargs):
        raise NotImplementedError(
            f"torchaudio.{name} is not available: this venv ships a torchaudio stub "
            "(tests/env/stubs/torchaudio); audio datasets are not supported here"
        )

    _fn.__name__ = name
    return _fn


load = _unavailable("load")
save = _unavailable("save")
info = _unavailable("info")

"""Stub of ``torchaudio.functional`` (see ``torchaudio/__init__.py``)."""


def resample(*args, **kwargs):
    raise NotImplementedError(
        "torchaudio.functional.resample is not available: this venv ships a torchaudio stub"
    )

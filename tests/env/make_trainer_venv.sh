#!/usr/bin/env bash
# make_trainer_venv.sh DEST
#
# Create (or bring up to date) the CPU "trainer" virtualenv at DEST: the remote
# interpreter that test job specs point at with `python: DEST/bin/python`.
# It holds torch 2.13.0 (CPU wheel from local disk), llamafactory 0.9.5,
# transformers/tokenizers/peft/trl/accelerate/datasets and deepspeed, pinned in
# tests/env/trainer-requirements.txt, plus two local workarounds:
#   * a stand-in `torchaudio` package      (tests/env/stubs/torchaudio)
#   * a sitecustomize.py for CPU DDP resume (tests/env/sitecustomize)
# and bitsandbytes moved out of site-packages into DEST/optional (park_bitsandbytes).
# See tests/env/README.md for why. The shared steps are in tests/env/venv_lib.sh.
#
# Environment:
#   PYTHON           base interpreter (default: python3; must be CPython 3.11)
#   TORCH_WHEEL_DIR  where the torch 2.13.0 CPU wheel lies (default: /opt/wheels)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILDER="$HERE/$(basename "${BASH_SOURCE[0]}")"
NAME=trainer
REQS="$HERE/trainer-requirements.txt"
CONSTRAINTS="$HERE/trainer-constraints.txt"
STUBS="$HERE/stubs"
# The stub's __init__.py is named outright, so a missing stubs/ fails before pip runs.
mapfile -t INPUTS < <(find "$STUBS" -type f -name '*.py' 2>/dev/null | LC_ALL=C sort)
INPUTS+=("$STUBS/torchaudio/__init__.py")
source "$HERE/venv_lib.sh"

install_pinned() { install_reqs_then_deepspeed; }

place_local_files() {
    rm -rf "$1/torchaudio"
    mkdir -p "$1/torchaudio"
    cp "$STUBS"/torchaudio/*.py "$1/torchaudio/"
    park_bitsandbytes "$1"
}

# bitsandbytes is moved out of site-packages into DEST/optional, which only the optimizer tests
# put on PYTHONPATH (tests/training.py OPTIONAL_PATH). Installed, peft imports it whenever it
# builds LoRA layers, and its import compiles four torch.compile ops: 0.65-0.75 s of CPU in
# every LoRA rank of the suite (LLaMA-Factory's run phase 1.5 s -> 0.7 s measured without it).
park_bitsandbytes() {
    local opt="$DEST/optional"
    rm -rf "$opt" && mkdir -p "$opt"
    mv "$1"/bitsandbytes "$1"/bitsandbytes-*.dist-info "$opt/"
}

after_local_files() { build_deepspeed_ops; }

verify_source() {
    printf '%s' "$COMMON_VERIFY"
    cat <<'PYEOF'
import torchaudio

assert getattr(torchaudio, "STUB", False), "torchaudio is not the stub"
assert importlib.util.find_spec("bitsandbytes") is None, "bitsandbytes is on the default path"
import deepspeed  # noqa: F401
import llamafactory.train.tuner  # noqa: F401
import peft  # noqa: F401
import tokenizers  # noqa: F401
import transformers  # noqa: F401
import trl  # noqa: F401
import adam_mini  # noqa: F401
import badam  # noqa: F401

sys.path.insert(0, os.path.join(sys.prefix, "optional"))   # as the 8-bit optimizer tests' jobs
import bitsandbytes  # noqa: F401

names = ["torch", "transformers", "tokenizers", "accelerate", "datasets", "peft", "trl",
         "deepspeed", "llamafactory", "badam", "adam-mini", "bitsandbytes"]
print("trainer venv:", " ".join(f"{n}=={md.version(n)}" for n in names))
PYEOF
}

build_venv "$@"

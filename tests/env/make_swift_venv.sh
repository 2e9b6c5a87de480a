#!/usr/bin/env bash
# make_swift_venv.sh DEST
#
# Create (or bring up to date) the CPU ms-swift virtualenv at DEST: the remote
# interpreter that swift test job specs point at with `python: DEST/bin/python`.
# It holds torch 2.13.0 (CPU wheel from local disk only), ms-swift 4.6.0 and DeepSpeed
# 0.19.8 (its CPU shm op prebuilt, as in the trainer venv) with every dependency pinned
# in tests/env/swift-requirements.txt, plus the trainer
# venv's sitecustomize.py (CPU DDP resume "cpu:0" fix, gloo exit-time SIGABRT fix;
# see tests/env/README.md). The shared steps are in tests/env/venv_lib.sh.
#
# Environment: PYTHON, TORCH_WHEEL_DIR as for make_trainer_venv.sh.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILDER="$HERE/$(basename "${BASH_SOURCE[0]}")"
NAME=swift
REQS="$HERE/swift-requirements.txt"
CONSTRAINTS="$HERE/swift-constraints.txt"
INPUTS=()
source "$HERE/venv_lib.sh"

install_pinned() { install_reqs_then_deepspeed; }

place_local_files() { :; }

after_local_files() { build_deepspeed_ops; }

verify_source() {
    printf '%s' "$COMMON_VERIFY"
    cat <<'PYEOF'
os.environ.setdefault("MODELSCOPE_OFFLINE", "1")
from swift.pipelines import sft_main  # noqa: F401  (what swift.cli.sft runs)
import deepspeed  # noqa: F401  (swift jobs with `deepspeed:`)

for mod in ("swift.cli.sft", "swift.cli._megatron.sft"):  # mlaunch's entry modules
    assert importlib.util.find_spec(mod), f"{mod} missing"
names = ["torch", "ms-swift", "transformers", "accelerate", "peft", "trl", "datasets", "deepspeed"]
print("swift venv:", " ".join(f"{n}=={md.version(n)}" for n in names))
PYEOF
}

build_venv "$@"

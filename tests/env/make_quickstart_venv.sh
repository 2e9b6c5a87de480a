#!/usr/bin/env bash
# make_quickstart_venv.sh DEST
#
# The quickstart's trainer: the CPU trainer venv (make_trainer_venv.sh) without what a LoRA
# run on 2 local processes never imports: DeepSpeed (and the minutes of building its CPU
# ops), the optional optimizers (badam, adam-mini, bitsandbytes) and their build tools.
# Its package list is trainer-requirements.txt minus those lines, so the two never drift.
# Built once per machine into the same cache as the other venvs (tests/env/venv_lib.sh).
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILDER="$HERE/$(basename "${BASH_SOURCE[0]}")"
NAME=quickstart
CONSTRAINTS="$HERE/trainer-constraints.txt"
STUBS="$HERE/stubs"
# Left out of the trainer's list: DeepSpeed and its own dependencies, the optional
# optimizers, and the build tools only DeepSpeed's sdist needs.
SKIP='^(deepspeed|badam|adam-mini|bitsandbytes|ninja|hjson|py-cpuinfo|msgpack|setuptools|wheel)=='
REQS=$(mktemp)
trap 'rm -f "$REQS"' EXIT
grep -v -i -E "$SKIP" "$HERE/trainer-requirements.txt" > "$REQS"
INPUTS=("$HERE/trainer-requirements.txt" "$STUBS/torchaudio/__init__.py")
source "$HERE/venv_lib.sh"

install_pinned() {
    log "installing pinned packages (no DeepSpeed)"
    pip_ install -q --no-deps -r "$REQS"
}

place_local_files() {
    rm -rf "$1/torchaudio"
    mkdir -p "$1/torchaudio"
    cp "$STUBS"/torchaudio/*.py "$1/torchaudio/"
}

verify_source() {
    printf '%s' "$COMMON_VERIFY"
    cat <<'PYEOF'
import llamafactory.train.tuner  # noqa: F401
import peft  # noqa: F401

names = ["torch", "transformers", "peft", "llamafactory"]
print("quickstart venv:", " ".join(f"{n}=={md.version(n)}" for n in names))
PYEOF
}

build_venv "$@"

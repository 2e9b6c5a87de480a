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
# See tests/env/README.md for why.
#
# Idempotent: a second run with unchanged inputs only re-checks the venv
# (a few seconds).  Safe to call concurrently for the same DEST (flock).
#
# Environment:
#   PYTHON           base interpreter (default: python3; must be CPython 3.11)
#   TORCH_WHEEL_DIR  where the torch 2.13.0 CPU wheel lies (default: /opt/wheels)
set -euo pipefail

START_NS=$(date +%s%N)
log() { printf 'make_trainer_venv: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
elapsed() { local now; now=$(date +%s%N); awk -v a="$START_NS" -v b="$now" 'BEGIN{printf "%.1f", (b-a)/1e9}'; }

[ $# -eq 1 ] || { echo "usage: $0 DEST" >&2; exit 2; }
DEST=$1
case $DEST in /*) ;; *) DEST="$PWD/$DEST" ;; esac

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REQS="$HERE/trainer-requirements.txt"
CONSTRAINTS="$HERE/trainer-constraints.txt"
STUBS="$HERE/stubs"
SITECUSTOMIZE="$HERE/sitecustomize/sitecustomize.py"
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
TORCH_WHEEL_DIR=${TORCH_WHEEL_DIR:-/opt/wheels}

for f in "$REQS" "$CONSTRAINTS" "$SITECUSTOMIZE" "$STUBS/torchaudio/__init__.py"; do
    [ -f "$f" ] || die "missing $f"
done

mkdir -p "$(dirname "$DEST")"
# One builder at a time for a given DEST.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$DEST.lock"
    flock 9
fi

# Every pip call gets the torch constraint, also any pip a build step might start.
export PIP_CONSTRAINT="$CONSTRAINTS"
export PIP_DISABLE_PIP_VERSION_CHECK=1
export PIP_NO_INPUT=1
PY="$DEST/bin/python"
pip_() { "$PY" -m pip "$@" -c "$CONSTRAINTS"; }

# Fingerprint of everything that defines the venv's contents.
STAMP="$DEST/.trainer-venv.sha256"
fingerprint() {
    { "$PYTHON" -c 'import sys; print(sys.version)'
      cat "$REQS" "$CONSTRAINTS" "$SITECUSTOMIZE" "${BASH_SOURCE[0]}"
      find "$STUBS" -type f -name '*.py' | LC_ALL=C sort | xargs cat
    } | sha256sum | cut -d' ' -f1
}
WANT=$(fingerprint)

# ---- 1. the virtualenv -------------------------------------------------------
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
    || die "$PYTHON is not Python 3.11 (the torch $TORCH_VERSION wheel is cp311)"
if [ ! -x "$PY" ] || ! "$PY" -c 'import sys' >/dev/null 2>&1; then
    if [ -e "$DEST/pyvenv.cfg" ]; then
        log "removing broken venv at $DEST"
        rm -rf "$DEST"
    elif [ -e "$DEST" ] && [ -n "$(ls -A "$DEST" 2>/dev/null)" ]; then
        die "$DEST exists, is not empty and is not a venv; not touching it"
    fi
    log "creating venv at $DEST"
    "$PYTHON" -m venv "$DEST"
fi

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    log "venv inputs unchanged; verifying only"
    UP_TO_DATE=1
else
    UP_TO_DATE=0
    rm -f "$STAMP"
fi

if [ "$UP_TO_DATE" = 0 ]; then
    # ---- 2. torch: the CPU wheel from local disk, never from an index ----------
    have_torch=$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
    if [ "${have_torch%%+*}" != "$TORCH_VERSION" ]; then
        log "installing torch==$TORCH_VERSION from $TORCH_WHEEL_DIR (no index)"
        ls "$TORCH_WHEEL_DIR"/torch-"$TORCH_VERSION"*-cp311-*.whl >/dev/null 2>&1 \
            || die "no torch $TORCH_VERSION cp311 wheel in $TORCH_WHEEL_DIR; refusing to fetch one (PyPI's is a multi-GB CUDA build)"
        pip_ install --no-deps --no-index --find-links "$TORCH_WHEEL_DIR" "torch==$TORCH_VERSION"
    fi

    # ---- 3. everything else, exactly as pinned (no resolver: --no-deps) -------
    # deepspeed is an sdist whose setup.py imports torch, so it is built without
    # build isolation, after everything else (setuptools, wheel, numpy...) is in.
    tmp_reqs=$(mktemp)
    trap 'rm -f "$tmp_reqs"' EXIT
    grep -v -i '^deepspeed==' "$REQS" > "$tmp_reqs"
    ds_pin=$(grep -i -o '^deepspeed==[^ #]*' "$REQS") || die "no deepspeed pin in $REQS"
    log "installing pinned packages"
    pip_ install --no-deps -r "$tmp_reqs"
    log "installing $ds_pin (DS_BUILD_OPS=0)"
    DS_BUILD_OPS=0 pip_ install --no-deps --no-build-isolation "$ds_pin"

    # ---- 4. CUDA torchvision/torchaudio must not be there ----------------------
    for pkg in torchvision torchaudio; do
        if "$PY" -m pip show -q "$pkg" >/dev/null 2>&1; then
            log "uninstalling $pkg (PyPI build is CUDA; breaks import transformers)"
            "$PY" -m pip uninstall -y -q "$pkg"
        fi
    done
fi

# ---- 5. local workarounds (always re-copied: cheap) ---------------------------
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf "$SITE/torchaudio"
mkdir -p "$SITE/torchaudio"
cp "$STUBS"/torchaudio/*.py "$SITE/torchaudio/"
cp "$SITECUSTOMIZE" "$SITE/sitecustomize.py"

# ---- 6. verify ------------------------------------------------------------------
log "verifying"
"$PY" - "$TORCH_VERSION" <<'EOF'
import importlib.metadata as md
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
want_torch = sys.argv[1]
import torch

assert torch.__version__.split("+")[0] == want_torch, f"torch {torch.__version__} != {want_torch}"
assert torch.version.cuda is None, f"torch is a CUDA build ({torch.version.cuda})"
for dist in ("torchvision", "torchaudio"):
    try:
        md.version(dist)
    except md.PackageNotFoundError:
        pass
    else:
        raise AssertionError(f"{dist} is installed; it must not be")
import torchaudio

assert getattr(torchaudio, "STUB", False), "torchaudio is not the stub"
import torch.serialization as ts

assert getattr(ts, "_tests_env_cpu_n_registered", False), "sitecustomize cpu:N fix not active"
import deepspeed  # noqa: F401
import llamafactory.train.tuner  # noqa: F401
import peft  # noqa: F401
import tokenizers  # noqa: F401
import transformers  # noqa: F401
import trl  # noqa: F401

names = ["torch", "transformers", "tokenizers", "accelerate", "datasets", "peft", "trl",
         "deepspeed", "llamafactory"]
print("trainer venv:", " ".join(f"{n}=={md.version(n)}" for n in names))
EOF

printf '%s\n' "$WANT" > "$STAMP"
log "ready: $DEST (took $(elapsed) s)"

#!/usr/bin/env bash
# make_swift_venv.sh DEST
#
# Create (or bring up to date) the CPU ms-swift virtualenv at DEST: the remote
# interpreter that swift test job specs point at with `python: DEST/bin/python`.
# It holds torch 2.13.0 (CPU wheel from local disk only) and ms-swift 4.6.0 with
# every dependency pinned in tests/env/swift-requirements.txt, plus the trainer
# venv's sitecustomize.py (CPU DDP resume "cpu:0" fix, gloo exit-time SIGABRT fix;
# see tests/env/README.md).
#
# Idempotent (a stamp skips pip when nothing changed) and safe to call concurrently
# for the same DEST (flock).
#
# Environment:
#   PYTHON           base interpreter (default: python3; must be CPython 3.11)
#   TORCH_WHEEL_DIR  where the torch 2.13.0 CPU wheel lies (default: /opt/wheels)
set -euo pipefail

START_NS=$(date +%s%N)
log() { printf 'make_swift_venv: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
elapsed() { local now; now=$(date +%s%N); awk -v a="$START_NS" -v b="$now" 'BEGIN{printf "%.1f", (b-a)/1e9}'; }

[ $# -eq 1 ] || { echo "usage: $0 DEST" >&2; exit 2; }
DEST=$1
case $DEST in /*) ;; *) DEST="$PWD/$DEST" ;; esac

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REQS="$HERE/swift-requirements.txt"
CONSTRAINTS="$HERE/swift-constraints.txt"
SITECUSTOMIZE="$HERE/sitecustomize/sitecustomize.py"
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
TORCH_WHEEL_DIR=${TORCH_WHEEL_DIR:-/opt/wheels}

for f in "$REQS" "$CONSTRAINTS" "$SITECUSTOMIZE"; do
    [ -f "$f" ] || die "missing $f"
done

mkdir -p "$(dirname "$DEST")"
if command -v flock >/dev/null 2>&1; then
    exec 9>"$DEST.lock"
    flock 9
fi

export PIP_CONSTRAINT="$CONSTRAINTS"
export PIP_DISABLE_PIP_VERSION_CHECK=1
export PIP_NO_INPUT=1
PY="$DEST/bin/python"
pip_() { "$PY" -m pip "$@" -c "$CONSTRAINTS"; }

STAMP="$DEST/.swift-venv.sha256"
fingerprint() {
    { "$PYTHON" -c 'import sys; print(sys.version)'
      cat "$REQS" "$CONSTRAINTS" "$SITECUSTOMIZE" "${BASH_SOURCE[0]}"
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
else
    rm -f "$STAMP"
    # ---- 2. torch: the CPU wheel from local disk, never from an index ----------
    have_torch=$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
    if [ "${have_torch%%+*}" != "$TORCH_VERSION" ]; then
        log "installing torch==$TORCH_VERSION from $TORCH_WHEEL_DIR (no index)"
        ls "$TORCH_WHEEL_DIR"/torch-"$TORCH_VERSION"*-cp311-*.whl >/dev/null 2>&1 \
            || die "no torch $TORCH_VERSION cp311 wheel in $TORCH_WHEEL_DIR; refusing to fetch one (PyPI's is a multi-GB CUDA build)"
        pip_ install --no-deps --no-index --find-links "$TORCH_WHEEL_DIR" "torch==$TORCH_VERSION"
    fi
    # ---- 3. everything else, exactly as pinned (no resolver: --no-deps) -------
    log "installing pinned packages"
    pip_ install --no-deps -r "$REQS"
    for pkg in torchvision torchaudio; do
        if "$PY" -m pip show -q "$pkg" >/dev/null 2>&1; then
            log "uninstalling $pkg (PyPI build is CUDA; breaks import transformers)"
            "$PY" -m pip uninstall -y -q "$pkg"
        fi
    done
fi

# ---- 4. local workaround (always re-copied: cheap) ----------------------------
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp "$SITECUSTOMIZE" "$SITE/sitecustomize.py"

# ---- 5. verify ------------------------------------------------------------------
log "verifying"
"$PY" - "$TORCH_VERSION" <<'PYEOF'
import importlib.metadata as md
import importlib.util
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MODELSCOPE_OFFLINE", "1")
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
import torch.serialization as ts

assert getattr(ts, "_tests_env_cpu_n_registered", False), "sitecustomize cpu:N fix not active"
from swift.pipelines import sft_main  # noqa: F401  (what swift.cli.sft runs)

for mod in ("swift.cli.sft", "swift.cli._megatron.sft"):  # mlaunch's entry modules
    assert importlib.util.find_spec(mod), f"{mod} missing"
names = ["torch", "ms-swift", "transformers", "accelerate", "peft", "trl", "datasets"]
print("swift venv:", " ".join(f"{n}=={md.version(n)}" for n in names))
PYEOF

printf '%s\n' "$WANT" > "$STAMP"
log "ready: $DEST (took $(elapsed) s)"

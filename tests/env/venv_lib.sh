# Shared body of make_trainer_venv.sh and make_swift_venv.sh (sourced, not run).
#
# The caller sets BUILDER (its own path), NAME, REQS, CONSTRAINTS and INPUTS (extra files
# that define the venv),
# defines install_pinned (pip installs after torch), place_local_files SITE and
# verify_source (Python read on stdin, argv[1] = torch version), then calls build_venv DEST.
# Every venv: torch 2.13.0 from the local CPU wheel only, never an index; no CUDA
# torchvision/torchaudio; tests/env/sitecustomize; a stamp that skips pip when nothing
# changed; one builder at a time per DEST (flock).
set -euo pipefail

START_NS=$(date +%s%N)
log() { printf 'make_%s_venv: %s\n' "$NAME" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
elapsed() { local now; now=$(date +%s%N); awk -v a="$START_NS" -v b="$now" 'BEGIN{printf "%.1f", (b-a)/1e9}'; }

ENV_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SITECUSTOMIZE="$ENV_DIR/sitecustomize/sitecustomize.py"
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
TORCH_WHEEL_DIR=${TORCH_WHEEL_DIR:-/opt/wheels}

pip_() { "$PY" -m pip "$@" -c "$CONSTRAINTS"; }
after_local_files() { :; }   # a builder may redefine it (after sourcing this file)

# DeepSpeed is an sdist whose setup.py imports torch: it is built without build isolation,
# after everything else in REQS (setuptools, wheel, numpy...) is installed, with no op
# compiled ahead (DS_BUILD_OPS=0). Both venvs install it this way.
install_reqs_then_deepspeed() {
    local ds_pin
    ds_pin=$(grep -i -o '^deepspeed==[^ #]*' "$REQS") || die "no deepspeed pin in $REQS"
    log "installing pinned packages"
    pip_ install --no-deps -r <(grep -v -i '^deepspeed==' "$REQS")
    log "installing $ds_pin (DS_BUILD_OPS=0)"
    DS_BUILD_OPS=0 pip_ install --no-deps --no-build-isolation "$ds_pin"
}

# DeepSpeed's CPU shm op, built now into the venv's TORCH_EXTENSIONS_DIR (sitecustomize
# points every worker there): test runs never JIT-compile, never wait on a build lock.
# A lock found here was left by a killed build (the builder holds the venv's flock).
# It is built with the venv's own ninja first on PATH, as in every worker (mlaunch puts the
# python's bin/ first): ninja 1.11 (/usr/bin) and 1.12+ hash command lines differently, so
# an op built by the system's ninja was rebuilt by the first DeepSpeed run of every CI
# (about 25 s of both cores, with every rank waiting on the build lock).
build_deepspeed_shm_op() {
    local ext="$DEST/torch_extensions" dir
    find "$ext" -name lock -type f -delete 2>/dev/null || true
    log "building DeepSpeed's CPU shm op into $ext"
    PATH="$DEST/bin:$PATH" timeout 600 "$PY" -c 'from deepspeed.accelerator import get_accelerator
b = get_accelerator().create_op_builder("ShareMemCommBuilder")
b.load(verbose=False)' >/dev/null 2>&1 || die "building DeepSpeed's shm op failed"
    for dir in "$ext"/*/; do
        "$DEST/bin/ninja" -C "$dir" -n 2>&1 | grep -q 'no work to do' \
            || die "DeepSpeed's shm op in $dir is not up to date for $DEST/bin/ninja"
    done
}

fingerprint() {
    { "$PYTHON" -c 'import sys; print(sys.version)'
      cat "$REQS" "$CONSTRAINTS" "$SITECUSTOMIZE" "${BASH_SOURCE[0]}" "$BUILDER" "${INPUTS[@]}"
    } | sha256sum | cut -d' ' -f1
}

ensure_venv() {
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
        || die "$PYTHON is not Python 3.11 (the torch $TORCH_VERSION wheel is cp311)"
    if [ -x "$PY" ] && "$PY" -c 'import sys' >/dev/null 2>&1; then
        return
    fi
    if [ -e "$DEST/pyvenv.cfg" ]; then
        log "removing broken venv at $DEST"
        rm -rf "$DEST"
    elif [ -e "$DEST" ] && [ -n "$(ls -A "$DEST" 2>/dev/null)" ]; then
        die "$DEST exists, is not empty and is not a venv; not touching it"
    fi
    log "creating venv at $DEST"
    "$PYTHON" -m venv "$DEST"
}

install_torch() {
    local have
    have=$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
    [ "${have%%+*}" = "$TORCH_VERSION" ] && return
    log "installing torch==$TORCH_VERSION from $TORCH_WHEEL_DIR (no index)"
    ls "$TORCH_WHEEL_DIR"/torch-"$TORCH_VERSION"*-cp311-*.whl >/dev/null 2>&1 \
        || die "no torch $TORCH_VERSION cp311 wheel in $TORCH_WHEEL_DIR; refusing to fetch one (PyPI's is a multi-GB CUDA build)"
    pip_ install --no-deps --no-index --find-links "$TORCH_WHEEL_DIR" "torch==$TORCH_VERSION"
}

drop_cuda_extras() {
    local pkg
    for pkg in torchvision torchaudio; do
        if "$PY" -m pip show -q "$pkg" >/dev/null 2>&1; then
            log "uninstalling $pkg (PyPI build is CUDA; breaks import transformers)"
            "$PY" -m pip uninstall -y -q "$pkg"
        fi
    done
}

build_venv() {
    [ $# -eq 1 ] || { echo "usage: $BUILDER DEST" >&2; exit 2; }
    DEST=$1
    case $DEST in /*) ;; *) DEST="$PWD/$DEST" ;; esac
    local f
    for f in "$REQS" "$CONSTRAINTS" "$SITECUSTOMIZE" "${INPUTS[@]}"; do
        [ -f "$f" ] || die "missing $f"
    done
    mkdir -p "$(dirname "$DEST")"
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$DEST.lock"
        flock 9
    fi
    # Every pip call gets the torch constraint, also any pip a build step might start.
    export PIP_CONSTRAINT="$CONSTRAINTS" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
    PY="$DEST/bin/python"
    local stamp="$DEST/.$NAME-venv.sha256" want
    want=$(fingerprint)
    ensure_venv
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        log "venv inputs unchanged; verifying only"
    else
        rm -f "$stamp"
        install_torch
        install_pinned
        drop_cuda_extras
    fi
    # Local workarounds are always re-copied: cheap, and never stale.
    local site
    site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    cp "$SITECUSTOMIZE" "$site/sitecustomize.py"
    place_local_files "$site"
    after_local_files
    log "verifying"
    verify_source | "$PY" - "$TORCH_VERSION"
    printf '%s\n' "$want" > "$stamp"
    log "ready: $DEST (took $(elapsed) s)"
}

# The checks both venvs share, for the start of verify_source.
COMMON_VERIFY='
import importlib.metadata as md
import importlib.util
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
import torch.serialization as ts

assert getattr(ts, "_tests_env_cpu_n_registered", False), "sitecustomize cpu:N fix not active"
'

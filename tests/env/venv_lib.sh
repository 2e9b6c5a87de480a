# Shared body of make_trainer_venv.sh and make_swift_venv.sh (sourced, not run).
#
# The caller sets BUILDER (its own path), NAME, REQS, CONSTRAINTS and INPUTS (extra files
# that define the venv),
# defines install_pinned (pip installs after torch), place_local_files SITE and
# verify_source (Python read on stdin, argv[1] = torch version), then calls build_venv DEST.
# Every venv: torch 2.13.0 from the local CPU wheel only, never an index; no CUDA
# torchvision/torchaudio; tests/env/sitecustomize; built once per machine into a cache
# entry named by the hash of its inputs (cache_root), DEST a link to it; one builder at a
# time per entry (flock).
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

# DeepSpeed's CPU ops, built now into the venv's TORCH_EXTENSIONS_DIR (sitecustomize points
# every worker there): test runs never JIT-compile, never wait on a build lock. The shm op
# is what gloo's DeepSpeed comm uses; CPUAdam is the optimizer ZeRO-Offload swaps in
# (offload_optimizer: cpu), which the shrink tests resume at another world.
# A lock found here was left by a killed build (the builder holds the venv's flock).
# They are built with the venv's own ninja first on PATH, as in every worker (mlaunch puts the
# python's bin/ first): ninja 1.11 (/usr/bin) and 1.12+ hash command lines differently, so
# an op built by the system's ninja was rebuilt by the first DeepSpeed run of every CI
# (about 25 s of both cores, with every rank waiting on the build lock).
build_deepspeed_ops() {
    local ext="$DEST/torch_extensions" dir op
    find "$ext" -name lock -type f -delete 2>/dev/null || true
    for op in ShareMemCommBuilder CPUAdamBuilder; do
        log "building DeepSpeed's $op op into $ext"
        PATH="$DEST/bin:$PATH" timeout 900 "$PY" -c "from deepspeed.accelerator import get_accelerator
get_accelerator().create_op_builder('$op').load(verbose=False)" >/dev/null 2>&1 \
            || die "building DeepSpeed's $op op failed"
    done
    for dir in "$ext"/*/; do
        "$DEST/bin/ninja" -C "$dir" -n 2>&1 | grep -q 'no work to do' \
            || die "DeepSpeed's op in $dir is not up to date for $DEST/bin/ninja"
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

# Where built venvs live, one per hash of their inputs, shared by every checkout of this
# machine: MLAUNCH_VENV_CACHE, else /var/cache/mlaunch-venvs where writable (root), else
# ${XDG_CACHE_HOME:-~/.cache}/mlaunch-venvs.
cache_root() {
    if [ -n "${MLAUNCH_VENV_CACHE:-}" ]; then
        echo "$MLAUNCH_VENV_CACHE"
    elif mkdir -p /var/cache/mlaunch-venvs 2>/dev/null && [ -w /var/cache/mlaunch-venvs ]; then
        echo /var/cache/mlaunch-venvs
    else
        echo "${XDG_CACHE_HOME:-$HOME/.cache}/mlaunch-venvs"
    fi
}

# DEST (the checkout's path) becomes a link to the cache entry. A real directory there is an
# in-place venv of an older builder: it is replaced only when it carries this builder's stamp.
link_dest() {
    if [ -d "$DEST" ] && [ ! -L "$DEST" ]; then
        ls "$DEST"/.*-venv.sha256 >/dev/null 2>&1 \
            || die "$DEST exists and is not a venv this builder made; not touching it"
        log "replacing the in-place venv at $DEST by a link to $ENTRY"
        rm -rf "$DEST"
    fi
    ln -sfn "$ENTRY" "$DEST.link.$$" && mv -T "$DEST.link.$$" "$DEST"
}

# Venvs are not relocatable (pip writes the venv's path into every script's #! line and
# the shm op's build files name it), so an entry is built at its final path, and complete
# means "its stamp exists": the stamp is written last, after the verification passed. An
# entry without one was left by a killed build and is removed before building again.
build_entry() {
    local stamp="$ENTRY/.$NAME-venv.sha256"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        log "cached venv $ENTRY (inputs unchanged); verifying only"
        DEST=$ENTRY PY="$ENTRY/bin/python"
        verify_source | "$PY" - "$TORCH_VERSION"
        return
    fi
    if [ -e "$ENTRY" ]; then
        log "removing the unfinished cache entry $ENTRY (a killed build)"
        rm -rf "$ENTRY"
    fi
    DEST=$ENTRY PY="$ENTRY/bin/python"
    ensure_venv
    install_torch
    install_pinned
    drop_cuda_extras
    local site
    site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    cp "$SITECUSTOMIZE" "$site/sitecustomize.py"
    place_local_files "$site"
    after_local_files
    log "verifying"
    verify_source | "$PY" - "$TORCH_VERSION"
    printf '%s\n' "$want" > "$stamp.tmp" && mv "$stamp.tmp" "$stamp"
}

build_venv() {
    [ $# -eq 1 ] || { echo "usage: $BUILDER DEST" >&2; exit 2; }
    DEST=$1
    case $DEST in /*) ;; *) DEST="$PWD/$DEST" ;; esac
    local f link_to
    for f in "$REQS" "$CONSTRAINTS" "$SITECUSTOMIZE" "${INPUTS[@]}"; do
        [ -f "$f" ] || die "missing $f"
    done
    mkdir -p "$(dirname "$DEST")"
    # Every pip call gets the torch constraint, also any pip a build step might start.
    export PIP_CONSTRAINT="$CONSTRAINTS" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
    want=$(fingerprint)
    CACHE=$(cache_root)
    mkdir -p "$CACHE"
    ENTRY="$CACHE/$NAME-${want:0:16}"
    link_to=$DEST
    # One builder per cache entry, whichever checkout it was started from.
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$ENTRY.lock"
        flock 9
    fi
    build_entry
    DEST=$link_to
    link_dest
    log "ready: $DEST -> $ENTRY (took $(elapsed) s)"
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

#!/usr/bin/env bash
# make_trainer_image.sh VENV
#
# Make the podman image the container tests run: Debian's python3.11 (the files of the
# installed Debian packages it needs, copied from this machine) plus the CPU trainer venv
# VENV's packages at /opt/trainer, imported with `podman import` (no registry is reachable
# here). Prints the image's name (localhost/mlaunch-trainer:<hash>) on its last line.
#
# Cached like the venvs: the tag is the hash of what goes in (this script, the venv's stamp,
# the python3.11 package version), and an image of that tag already in podman's storage is
# reused. debootstrap minbase would be the textbook route; copying the installed packages'
# files (dpkg -L of python3.11's dependency closure) gives the same Debian files in seconds.
set -euo pipefail
log() { printf 'make_trainer_image: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

VENV=$(readlink -f "${1:?usage: make_trainer_image.sh VENV}")
command -v podman >/dev/null || die "podman is not installed (apt-get install podman)"
command -v dpkg-query >/dev/null || die "not a Debian system (dpkg-query missing)"
[ -x "$VENV/bin/python" ] || die "$VENV is not a venv"
STAMP=$(cat "$VENV"/.*-venv.sha256 2>/dev/null || true)
[ -n "$STAMP" ] || die "$VENV has no build stamp: build it first (tests/env/make_trainer_venv.sh)"
PYVER=$(dpkg-query -W -f '${Version}' python3.11 2>/dev/null) || die "Debian's python3.11 is not installed"
KEY=$( { cat "${BASH_SOURCE[0]}"; echo "$STAMP"; echo "$PYVER"; } | sha256sum | cut -c1-16)
IMAGE="localhost/mlaunch-trainer:$KEY"

podman() { "$(dirname "${BASH_SOURCE[0]}")/podman_here.sh" "$@"; }

exec 9>"/var/tmp/mlaunch-trainer-image.lock"
flock 9
if podman image exists "$IMAGE"; then
    log "cached: $IMAGE"
    echo "$IMAGE"
    exit 0
fi

ROOT=$(mktemp -d /var/tmp/mlaunch-image.XXXXXX)
trap 'rm -rf "$ROOT" "$ROOT.list"' EXIT
# python3.11 and the tools a node shell needs, with their dependency closure (installed only).
SEED="python3.11 dash coreutils bash libstdc++6 libgcc-s1 procps util-linux"
PKGS=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
        --no-replaces --no-enhances --no-pre-depends $SEED 2>/dev/null | grep -v '^ ' | sed 's/:.*//' \
        | sort -u | while read -r p; do
            dpkg-query -W -f '${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' && echo "$p"
        done || true)
PKGS=$(printf '%s\n' $PKGS $SEED libc6 | sort -u)
log "copying $(echo "$PKGS" | wc -l) Debian packages' files"
# Files and links of those packages (directories are made by tar as needed).
for p in $PKGS; do dpkg-query -L "$p" 2>/dev/null; done | sort -u | while read -r f; do
    if [ -f "$f" ] || [ -L "$f" ]; then printf '%s\n' "${f#/}"; fi
done > "$ROOT.list"
# usrmerge: /bin, /lib, /lib64, /sbin are links into /usr on Debian 12.
mkdir -p "$ROOT/usr/bin" "$ROOT/usr/lib" "$ROOT/usr/lib64" "$ROOT/usr/sbin"
for d in bin lib lib64 sbin; do if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$ROOT/$d"; fi; done
tar -C / --no-recursion -cf - -T "$ROOT.list" | tar -C "$ROOT" -xf -
rm -f "$ROOT.list"
mkdir -p "$ROOT/tmp" "$ROOT/etc" "$ROOT/root" "$ROOT/proc" "$ROOT/sys" "$ROOT/dev" "$ROOT/run"
chmod 1777 "$ROOT/tmp"
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$ROOT/etc/passwd"
printf 'root:x:0:\n' > "$ROOT/etc/group"
ln -sf python3.11 "$ROOT/usr/bin/python3"
# Debian's own sitecustomize (/usr/lib/python3.11, before site-packages on sys.path) would
# shadow the trainer venv's (tests/env/sitecustomize: the CPU resume fix) and the tests' hold hook.
rm -f "$ROOT/usr/lib/python3.11/sitecustomize.py"

log "copying the trainer venv's packages to /opt/trainer"
mkdir -p "$ROOT/opt/trainer/bin"
cp -a "$VENV/lib" "$ROOT/opt/trainer/"
[ -d "$VENV/torch_extensions" ] && cp -a "$VENV/torch_extensions" "$ROOT/opt/trainer/"
ln -s /usr/bin/python3.11 "$ROOT/opt/trainer/bin/python"
ln -s python "$ROOT/opt/trainer/bin/python3"
printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11\n' > "$ROOT/opt/trainer/pyvenv.cfg"
# The venv's scripts (torchrun, llamafactory-cli, ...) with their #! line pointing inside.
for s in "$VENV"/bin/*; do
    [ -f "$s" ] && [ ! -L "$s" ] && head -c 2 "$s" | grep -q '#!' || continue
    sed "1s|^#!.*python.*$|#!/opt/trainer/bin/python|" "$s" > "$ROOT/opt/trainer/bin/$(basename "$s")"
    chmod 755 "$ROOT/opt/trainer/bin/$(basename "$s")"
done

log "importing $IMAGE"
tar -C "$ROOT" -cf - . | podman import --change 'ENV PATH=/opt/trainer/bin:/usr/local/bin:/usr/bin:/bin' \
    - "$IMAGE" >/dev/null
podman run --rm --network none "$IMAGE" /opt/trainer/bin/python -c \
    'import sitecustomize, torch, llamafactory; assert sitecustomize.__file__.startswith("/opt/trainer/"), sitecustomize.__file__; print("image ok: torch", torch.__version__, "llamafactory", llamafactory.__version__)' >&2 \
    || { podman rmi -f "$IMAGE" >/dev/null 2>&1; die "the image does not run its trainer"; }
echo "$IMAGE"

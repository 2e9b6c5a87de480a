#!/usr/bin/env bash
# The namespace hosts' tools for the GPU machine (the `device` tool), which has 16 cores but no
# sshd, ssh, iproute2, pdsh or paramiko: the log-flood benchmark there measures mlaunch where the
# "nodes" do not share the launcher's cores (bench/results/logpath-device-*.txt), and the
# first-step benchmark (bench/first_step.py) needs pdsh for its baseline.
#
#   bash bench/device_kit.sh build        # here: .sshkit/ (this machine's Debian binaries and
#                                         # their libraries) and .whl/ (the launcher's wheels)
#   bash bench/device_kit.sh run CMD...   # there, in the repo root, with carry [.sshkit, .whl]
# Both folders are listed in .git/info/exclude by `build` (they never go into the repo).
set -euo pipefail
K=$PWD/.sshkit
case "${1:-}" in
build)
  grep -qx '/.sshkit/' .git/info/exclude 2>/dev/null || printf '/.sshkit/\n/.whl/\n' >> .git/info/exclude
  rm -rf .sshkit .whl && mkdir -p .sshkit/bin .sshkit/real .sshkit/lib .sshkit/pdsh
  # pdsh's rcmd modules (ssh, exec, ...): `run` puts them where pdsh.bin looks, its
  # compiled-in module directory; their libraries (libgenders) come from ldd as the binaries' do.
  cp /usr/lib/x86_64-linux-gnu/pdsh/*.so .sshkit/pdsh/
  for b in /usr/sbin/sshd /usr/bin/ssh /usr/bin/ssh-keygen /usr/bin/ip /usr/sbin/tc /usr/bin/nsenter /usr/bin/unshare \
      /usr/bin/pdsh.bin .sshkit/pdsh/*.so; do
    case $b in *.so) ;; *) cp "$b" .sshkit/real/ ;; esac
    for l in $(ldd "$b" | awk '$3 ~ /^\// {print $3}'); do
      case $(basename "$l") in libc.so.6|libresolv.so.2|ld-linux*) ;; *) cp -nL "$l" .sshkit/lib/ ;; esac
    done
    n=$(basename "$b")
    case $n in *.so) continue ;; pdsh.bin)
      # Debian's /usr/bin/pdsh is a bash script that runs pdsh.bin as `exec -a pdsh` (pdsh
      # takes its personality, pdsh or pdcp, from argv[0]): the same, with the kit's libraries.
      printf '#!/bin/bash\nK=$(cd "$(dirname "$0")/.." && pwd)\nLD_LIBRARY_PATH="$K/lib" exec -a pdsh "$K/real/pdsh.bin" "$@"\n' > .sshkit/bin/pdsh
      chmod +x .sshkit/bin/pdsh; continue ;; esac
    # sshd re-executes itself by its absolute path: the wrapper execs the real one so.
    printf '#!/bin/sh\nK=$(cd "$(dirname "$0")/.." && pwd)\nLD_LIBRARY_PATH="$K/lib" exec "$K/real/%s" "$@"\n' "$n" > ".sshkit/bin/$n"
    chmod +x ".sshkit/bin/$n"
  done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_26_x86_64 --platform manylinux1_x86_64 -d .whl \
    paramiko==5.1.0 bcrypt==5.0.0 pynacl==1.6.2 cryptography==48.0.0 cffi==2.0.0 pycparser==3.0 \
    fabric==3.2.2 invoke==2.2.1 decorator==5.2.1 deprecated==1.3.1 wrapt==2.1.2 pydantic==2.13.4 \
    pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 typing_extensions==4.15.0
  du -sh .sshkit .whl ;;
run)
  shift
  id sshd >/dev/null 2>&1 || useradd -r -M -d /run/sshd -s /usr/sbin/nologin sshd   # privilege separation
  # pdsh.bin loads its modules from the directory it was built with and only from one that is
  # root's and not group/world-writable (it skips "insecure" modules): copy them there.
  install -d -m 755 /usr/lib/x86_64-linux-gnu/pdsh && install -m 644 "$K"/pdsh/*.so /usr/lib/x86_64-linux-gnu/pdsh/
  # The ARP table is one for all network namespaces (gc_thresh3 1024 by default): 64 hosts'
  # full mesh (gloo, preflight's mesh check) needs 64*63 entries, and past it dials fail with
  # "No route to host" or time out (dmesg: "arp_cache: neighbor table overflow!").
  # (/proc/sys written directly: the image may have no procps either.)
  for t in 1:8192 2:32768 3:65536; do
    echo "${t#*:}" 2>/dev/null > "/proc/sys/net/ipv4/neigh/default/gc_thresh${t%%:*}" ||
      echo "device_kit: gc_thresh${t%%:*} left at $(cat /proc/sys/net/ipv4/neigh/default/gc_thresh${t%%:*} 2>&1)" >&2
  done
  # Byte-compiled, as pip installs them: the image sets PYTHONDONTWRITEBYTECODE=1 and ships
  # packages without .pyc files (its jinja2 at least), which every launcher start, and every
  # torchrun where torch is one, would compile again (bench/results/launcher-start-device-*).
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD PATH=$K/bin:$PATH
  python3 -m compileall -q -j 0 $(python3 -c 'import importlib.util as u, os
for m in ("jinja2", "markupsafe", "yaml", "click", "torch", "numpy", "sympy", "networkx", "filelock", "fsspec"):
    s = u.find_spec(m)
    if s and s.origin: print(os.path.dirname(s.origin))') > /dev/null
  head -2 /etc/os-release; echo "cores: $(nproc)"; python3 --version; ssh -V; pdsh -V | head -2
  "$@" ;;
*) echo "usage: $0 build | run CMD..." >&2; exit 2 ;;
esac

#!/bin/sh
# podman with this test machine's adjustments (shared/FACTS.md, "Container engines"), for the
# tests and for test specs' `cluster.container.command`; not part of mlaunch:
#  * the open-file hard limit here is below what podman asks for: containers.conf beside this
#    script sets default_ulimits (CONTAINERS_CONF);
#  * crun refuses the empty cgroup2 mount at /sys/fs/cgroup/unified beside the v1 controllers
#    ("cgroups in hybrid mode not supported"): podman runs in a private mount namespace
#    without it;
#  * on a namespace test host (hostname mlh-*): `ip netns exec` remounted /sys, where crun
#    wants a cgroup fs: an empty cgroup2 mount there and no cgroups per container; and each
#    host its own container storage and state (the hosts share this machine's /run and /var:
#    one host's podman would judge another's containers by PIDs it cannot see), with the
#    images read-only from the machine's store (where make_trainer_image.sh put them).
here=$(cd "$(dirname "$0")" && pwd)
export CONTAINERS_CONF="$here/containers.conf"
h=$(hostname)
case "$h" in
mlh-*)
    d=/run/mlh-containers/$h
    if [ ! -f "$d/storage.conf" ]; then
        mkdir -p "$d" && cat > "$d/storage.conf.new" <<EOC && mv "$d/storage.conf.new" "$d/storage.conf"
[storage]
driver = "overlay"
graphroot = "/var/lib/mlh-containers/$h"
runroot = "$d/storage"
[storage.options]
additionalimagestores = ["/var/lib/containers/storage"]
EOC
    fi
    sed "s|^\[engine\]|[engine]\ntmp_dir = \"$d/libpod\"|" "$here/containers-nocgroup.conf" > "$d/containers.conf.$$" \
        && mv "$d/containers.conf.$$" "$d/containers.conf"
    export CONTAINERS_CONF="$d/containers.conf" CONTAINERS_STORAGE_CONF="$d/storage.conf"
    ;;
esac
if [ "$(stat -f -c %T /sys/fs/cgroup 2>/dev/null)" = sysfs ]; then
    exec unshare -m --propagation private sh -c 'mount -t cgroup2 none /sys/fs/cgroup && exec podman "$@"' podman "$@"
fi
if mountpoint -q /sys/fs/cgroup/unified 2>/dev/null; then
    exec unshare -m --propagation private sh -c 'umount /sys/fs/cgroup/unified && exec podman "$@"' podman "$@"
fi
exec podman "$@"

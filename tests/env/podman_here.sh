#!/bin/sh
# podman with this test machine's two adjustments (shared/FACTS.md, "Container engines"), for
# the tests and for test specs' `cluster.container.command`; not part of mlaunch:
#  * crun refuses the empty cgroup2 mount at /sys/fs/cgroup/unified beside the v1 controllers
#    ("cgroups in hybrid mode not supported"): podman runs in a private mount namespace
#    without that mount;
#  * the open-file hard limit here is below what podman asks for: containers.conf beside this
#    script sets default_ulimits (CONTAINERS_CONF).
here=$(cd "$(dirname "$0")" && pwd)
CONTAINERS_CONF="$here/containers.conf"
export CONTAINERS_CONF
if [ "$(stat -f -c %T /sys/fs/cgroup 2>/dev/null)" = sysfs ]; then
    # A namespace test host: `ip netns exec` remounted /sys, and crun wants a cgroup fs there.
    # An empty cgroup2 mount (every controller is the v1 hierarchies') and no cgroups per container.
    # Each host its own container storage and state (they share this machine's /run and
    # /var: one host's podman would otherwise judge another's containers by PIDs it cannot
    # see); images come read-only from the machine's store (where make_trainer_image.sh put them).
    h=$(hostname); d=/run/mlh-containers/$h
    if [ ! -f "$d/storage.conf" ]; then
        mkdir -p "$d" && cat > "$d/storage.conf.new" <<EOC && mv "$d/storage.conf.new" "$d/storage.conf"
[storage]
driver = "overlay"
graphroot = "/var/lib/mlh-containers/$h"
runroot = "$d/storage"
[storage.options]
additionalimagestores = ["/var/lib/containers/storage"]
EOC
        sed "s|^\[engine\]|[engine]\ntmp_dir = \"$d/libpod\"|" "$here/containers-nocgroup.conf" > "$d/containers.conf"
    fi
    export CONTAINERS_CONF="$d/containers.conf" CONTAINERS_STORAGE_CONF="$d/storage.conf"
    exec unshare -m --propagation private sh -c 'mount -t cgroup2 none /sys/fs/cgroup && exec podman "$@"' podman "$@"
fi
if mountpoint -q /sys/fs/cgroup/unified 2>/dev/null; then
    exec unshare -m --propagation private sh -c 'umount /sys/fs/cgroup/unified && exec podman "$@"' podman "$@"
fi
exec podman "$@"

#!/bin/sh
# podman with this test machine's two adjustments (shared/FACTS.md, "Container engines"), for
# the tests and for test specs' `cluster.container.command`; not part of mlaunch:
#  * crun refuses the empty cgroup2 mount at /sys/fs/cgroup/unified beside the v1 controllers
#    ("cgroups in hybrid mode not supported"): podman runs in a private mount namespace
#    without that mount;
#  * the open-file hard limit here is below what podman asks for: containers.conf beside this
#    script sets default_ulimits (CONTAINERS_CONF).
# The namespace test hosts remount /sys and show no cgroup fs at all: containers run there
# with --cgroups=disabled (containers.conf's cgroups = "disabled" when none is mounted).
here=$(cd "$(dirname "$0")" && pwd)
CONTAINERS_CONF="$here/containers.conf"
if [ ! -d /sys/fs/cgroup/cpu ] && [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
    CONTAINERS_CONF="$here/containers-nocgroup.conf"
fi
export CONTAINERS_CONF
if mountpoint -q /sys/fs/cgroup/unified 2>/dev/null; then
    exec unshare -m --propagation private sh -c 'umount /sys/fs/cgroup/unified && exec podman "$@"' podman "$@"
fi
exec podman "$@"

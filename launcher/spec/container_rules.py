"""Rules of `cluster.container`: which runtime fits which scheduler, the mounts' form, and the
runtime options mlaunch sets itself (a user value there would break the run or its teardown).

Each rule returns Problems (field path, what is wrong, the fix), one line each.
"""
from __future__ import annotations

import re

from ..errors import Problem
from .cluster_spec import Cluster, Container

RUNTIMES = {"ssh": ("podman", "docker"), "slurm": ("pyxis", "apptainer", "podman")}
IMAGE_RE = re.compile(r"^[^\s'\"\\$`]+$")
MOUNT_OPTS = {"ro", "rw", "z", "Z", "shared", "slave", "private", "rshared", "rslave",
              "rprivate", "bind", "rbind", "nosuid", "nodev", "noexec", "exec", "suid", "dev"}

# Runtime options mlaunch writes itself, each with why a user value would break the run.
OWNED_ARGS = {
    "--name": "mlaunch names each node's container after the run and node (teardown and stop "
              "remove it by that name)",
    "--rm": "mlaunch removes each container when its node ends",
    "--network": "NCCL and the rendezvous need the host's network: mlaunch sets it",
    "--net": "NCCL and the rendezvous need the host's network: mlaunch sets it",
    "--ipc": "NCCL needs the host's IPC namespace: mlaunch sets it",
    "--env": "give the variable in cluster.env (secrets enter by name, never as a value)",
    "-e": "give the variable in cluster.env (secrets enter by name, never as a value)",
    "--env-file": "give the variables in cluster.env",
    "--detach": "mlaunch follows the node's output in the foreground",
    "-d": "mlaunch follows the node's output in the foreground",
    "--workdir": "set cluster.workdir",
    "-w": "set cluster.workdir",
    "--pull": "set cluster.container.pull",
    "--gpus": "mlaunch passes the node's GPUs (cluster.container.gpus, cuda_visible_devices)",
    "--volume": "give it in cluster.container.mounts",
    "-v": "give it in cluster.container.mounts",
    "--entrypoint": "mlaunch runs torchrun (cluster.python is the interpreter inside the image)",
    "--container-image": "set cluster.container.image",
    "--container-mounts": "give them in cluster.container.mounts",
    "--container-name": "mlaunch names each node's container after the run",
    "--container-workdir": "set cluster.workdir",
    "--bind": "give it in cluster.container.mounts",
    "-B": "give it in cluster.container.mounts",
    "--pwd": "set cluster.workdir",
    "--cleanenv": "the run's environment (cluster.env, mlaunch's variables) must reach the ranks",
}


def check_container(c: Cluster) -> list[Problem]:
    """The container block against the scheduler, its image, mounts and args."""
    k = c.container
    if k is None:
        return []
    p: list[Problem] = []
    fits = RUNTIMES[c.scheduler]
    if k.runtime not in fits:
        p.append(Problem("cluster.container.runtime", f"{k.runtime} does not run under scheduler "
                         f"{c.scheduler}; use one of {', '.join(fits)}"))
    if not k.image.strip() or not IMAGE_RE.match(k.image):
        p.append(Problem("cluster.container.image", f"{k.image!r} is not an image name or file: "
                         "one word, no quotes, spaces or $"))
    if "pull" in k.model_fields_set and k.runtime in ("pyxis", "apptainer"):
        p.append(Problem("cluster.container.pull", f"{k.runtime} reads the image as given (a file "
                         "or enroot's own import): remove pull"))
    for i, m in enumerate(k.mounts):
        why = mount_problem(m)
        if why:
            p.append(Problem(f"cluster.container.mounts[{i}]", f"{m!r}: {why}"))
    for i, a in enumerate(k.args):
        name = a.split("=", 1)[0]
        if name in OWNED_ARGS:
            p.append(Problem(f"cluster.container.args[{i}]", f"{a!r} is mlaunch's own: "
                             f"{OWNED_ARGS[name]}; remove it"))
    if k.command is not None and (not k.command or not all(w.strip() for w in k.command)):
        p.append(Problem("cluster.container.command", "empty: give the runtime's command line, "
                         "e.g. [podman], or remove command"))
    return p


def mount_problem(mount: str) -> str | None:
    """Why SRC[:DST[:OPTIONS]] is no bind mount the runtimes all take, or None."""
    parts = mount.split(":")
    if len(parts) > 3 or not parts[0]:
        return "give SRC[:DST[:OPTIONS]], e.g. /data/models:/models:ro"
    if not all(x.startswith("/") for x in parts[:2]):
        return "paths must be absolute on the node and in the image"
    if len(parts) == 3 and not set(parts[2].split(",")) <= MOUNT_OPTS:
        return f"unknown option in {parts[2]!r}: use ro, rw or the runtime's propagation options"
    if any(ch in mount for ch in " ,'\"$`\\"):
        return "no spaces, commas, quotes or $ in a mount (pyxis and apptainer split on commas)"
    return None


def container_of(c: Cluster) -> Container | None:
    """The cluster's container block, or None when nodes run on the host."""
    return c.container

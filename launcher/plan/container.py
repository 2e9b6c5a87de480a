"""cluster.container in the plan: each node's runtime line (the words before its torchrun),
the container's name, and what removes it. Pure: the text comes from templates/container/.

A node's container is named mlaunch-<run id>-a<attempt>-n<rank>: the attempt and rank always
end the name, so no two (run, attempt, node) share one, and nodes of one machine's storage
(namespace hosts, several nodes on a host) never collide. teardown, stop and the hang-up
guard remove it by that name."""
from __future__ import annotations

import posixpath

from .. import render

RUNTIME_COMMAND = {"podman": ["podman"], "docker": ["docker"], "apptainer": ["apptainer"],
                   "pyxis": []}
# Variables not passed into the image: the host's PATH and the GPU list, which a runtime
# that passes GPUs by device renumbers inside (CDI, --gpus: the container sees 0..n-1).
HOST_ONLY = ("PATH",)


def container_name(run_id: str, attempt: int, rank) -> str:
    """The node's container name (rank may be a scheduler's ShellVar; None: one name for
    every node of the job, which pyxis keeps per node)."""
    if rank is None:
        return f"mlaunch-{run_id}-a{attempt}"
    return render.ShellVar(rank.var, f"mlaunch-{run_id}-a{attempt}-n") if isinstance(
        rank, render.ShellVar) else f"mlaunch-{run_id}-a{attempt}-n{rank}"


def command(job) -> list[str]:
    """The runtime's command line on the nodes: container.command, else its name."""
    k = job.cluster.container
    return list(k.command) if k.command else list(RUNTIME_COMMAND[k.runtime])


def mounts(job, run_dir: str) -> list[str]:
    """SRC:DST[:OPT] bind mounts: the workdir, shared_dir, output_dir and the run dir at their
    own paths (each only when no other covers it), then the user's. A user's SRC alone is
    bound at its own path, SRC:SRC: podman and docker read `-v /path` as an anonymous volume
    at /path, empty, not the node's directory."""
    c = job.cluster
    own = [p for p in (c.workdir, c.shared_dir, _abs(job.output_dir), run_dir) if p]
    own = sorted(dict.fromkeys(posixpath.normpath(p) for p in own))
    kept: list[str] = []
    for p in own:
        if not any(p == k or p.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(p)
    return [f"{p}:{p}" for p in kept] + [m if ":" in m else f"{m}:{m}" for m in c.container.mounts]


def _abs(path: str | None) -> str | None:
    return path if path and path.startswith("/") else None


def passes_gpu_list(runtime: str, gpus: bool, devices) -> bool:
    """CUDA_VISIBLE_DEVICES goes in as the host has it, unless the runtime gave the container
    just those devices (then it sees them as 0..n-1 and the host's indices would be wrong)."""
    return not (gpus and devices is not None and runtime in ("podman", "docker"))


def runtime_line(job, *, name, run_dir: str, env_names: list[str],
                 devices: list[int] | None) -> str:
    """The node's runtime line: its words before torchrun (pyxis: srun's options)."""
    k = job.cluster.container
    names = [n for n in env_names if n not in HOST_ONLY and (
        n != "CUDA_VISIBLE_DEVICES" or passes_gpu_list(k.runtime, k.gpus, devices))]
    return render.container_line(
        k.runtime, command=command(job), name=name, pull=k.pull, image=k.image,
        devices=devices, mounts=mounts(job, run_dir),
        workdir=job.cluster.workdir, env=names, args=list(k.args), gpus=k.gpus)


def removal(job, name) -> str | None:
    """Shell text that removes the node's container (None: the runtime names none to remove)."""
    k = job.cluster.container
    if k is None or k.runtime not in ("podman", "docker"):
        return None
    return render.container_rm(command(job), name)


def probe_line(job, *, name: str, env_names: list[str], devices: list[int] | None) -> str:
    """The runtime line of a preflight probe inside the image: the node's namespaces, GPUs and
    environment, stdin open (the probe's source comes on it), no mounts, the image as found
    (the checks before it pulled it when pull allows)."""
    k = job.cluster.container
    names = [n for n in env_names if n not in HOST_ONLY and (
        n != "CUDA_VISIBLE_DEVICES" or passes_gpu_list(k.runtime, k.gpus, devices))]
    return render.container_line(
        k.runtime, command=command(job), name=name, pull="never", image=k.image, interactive=True,
        devices=devices, mounts=[], workdir=None, env=names,
        args=list(k.args), gpus=k.gpus)


def probe_problems(job) -> dict[str, str]:
    """What each check a node's preflight runs before the probe in the image reports when it
    fails, by check (templates/preflight/pyprobe.sh.j2 holds the checks, in order: the runtime
    is installed, runs for this user, and the image is here or pulled as cluster.container.pull
    allows), each as JSON {"container": [what is wrong, the fix]}."""
    import json
    k = job.cluster.container
    cmd = command(job)
    shown = " ".join(cmd)
    problems = {
        "installed": [f"cluster.container: {cmd[0]} is not installed on this node (runtime {k.runtime})",
                      f"install {k.runtime} there, or set cluster.container.command to its path"],
        "info": [f"cluster.container: `{shown} info` fails for this user on this node",
                 f"run `{shown} info` there and fix what it says (rootless podman: /etc/subuid; "
                 "docker: the docker group)"],
        "image": ([f"cluster.container.image: {k.image} is not on this node and pull is never",
                   f"`{shown} pull {k.image}` (or load it) on the node, or set "
                   "cluster.container.pull: missing"] if k.pull == "never" else
                  [f"cluster.container.image: {k.image} is not on this node and `{shown} pull` "
                   "failed", "check the image's name and the node's login to its registry"]),
    }
    return {name: json.dumps({"container": p}) for name, p in problems.items()}


def software_facts() -> tuple[str, ...]:
    """The preflight facts that come from inside the image (launcher/nodeprog/facts.py keys)."""
    return ("python", "torch", "trainer", "torchrun", "ext_locks", "gpu")   # py-spy: the host's


"""The cluster section: the machines, how to reach them, how Slurm
allocates them (launcher/spec/models.py re-exports every name)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .hosts import USER_RE   # the rule of `user@host` host strings, for cluster.ssh.user too
from .ray_spec import Ray
from .strict import Strict


Procs = Annotated[int, Field(ge=1, le=1024)]
# A path (or file) field: text with something besides blanks. `""` would render an empty path
# into every node's command line (`cd ''`, `--model_name_or_path ''`), which fails only there;
# refused here, one line (explain_voice.blank), as `null` is for a required one.
NOT_BLANK = r"\S"
PathText = Annotated[str, Field(pattern=NOT_BLANK)]


class SSH(Strict):
    """How the launcher reaches each node."""

    user: Annotated[str, Field(pattern=USER_RE.pattern)] | None = None
    port: int = Field(22, ge=1, le=65535)
    key_file: PathText | None = None
    config_file: PathText | None = Field(None, description="an ssh_config file to read (aliases, ProxyJump, ...)")
    known_hosts: PathText | None = None
    jump_host: str | None = Field(None, description="[user@]host[:port] to hop through")
    strict_host_keys: bool = Field(True, description="refuse hosts whose key is not in known_hosts")
    connect_timeout: float = Field(10.0, gt=0, le=300)


class Slurm(Strict):
    """The allocation mlaunch asks Slurm for (cluster.scheduler: slurm); see slurm_rules.py."""

    nodes: int | None = Field(None, ge=1, le=100000, description="nodes to allocate (sbatch --nodes)")
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = Field(None, description="time limit in Slurm's forms: MM, MM:SS, HH:MM:SS, "
                             "D-HH, D-HH:MM, D-HH:MM:SS")
    constraint: str | None = None
    exclusive: bool = False
    reservation: str | None = None
    extra_sbatch: dict[str, str | int | bool] = Field(default_factory=dict, description=(
        "further #SBATCH options, long names without dashes: {gres: 'gpu:8', mem: 0}"))


class Container(Strict):
    """The image every node runs torchrun in (cluster.container); see container_rules.py and
    docs/containers.md."""

    image: str = Field(description=(
        "a tag (registry/name:tag), a local image, or under Slurm a .sqsh (pyxis) / .sif (apptainer) file"))
    runtime: Literal["podman", "docker", "pyxis", "apptainer"] = Field("podman", description=(
        "podman | docker on SSH nodes; pyxis (enroot) | apptainer | podman under Slurm"))
    mounts: list[str] = Field(default_factory=list, description=(
        "SRC[:DST[:OPTIONS]] bind mounts beside the workdir, output_dir and shared_dir, which "
        "mlaunch mounts itself"))
    pull: Literal["missing", "always", "never"] = Field("missing", description=(
        "podman/docker: pull the image when missing, before every run, or never (preflight "
        "refuses a missing image)"))
    args: list[str] = Field(default_factory=list, description=(
        "further options for the runtime's run/exec, e.g. [--shm-size=16g]"))
    gpus: bool = Field(True, description=(
        "pass the node's GPUs in (podman: CDI nvidia.com/gpu, docker: --gpus, apptainer: --nv); "
        "false on CPU nodes"))
    command: list[str] | None = Field(None, description=(
        "the runtime's command line on the nodes (default: its name, e.g. podman); e.g. "
        "[sudo, -n, podman] or a wrapper script"))


class Cluster(Strict):
    """The machines, the processes per machine, the rendezvous and the remote environment."""

    scheduler: Literal["ssh", "slurm", "ray"] = Field("ssh", description=(
        "ssh: mlaunch starts every host over SSH; slurm: one sbatch job, nodes from the "
        "allocation; ray: one bundle per node on a Ray cluster (cluster.ray)"))
    slurm: Slurm | None = None
    ray: Ray | None = None
    hosts: list[str] | None = Field(None, description=(
        "node 0 first: host, user@host, host:port or [v6addr]:port; or use hostfile"))
    hostfile: str | None = Field(None, description=(
        "DeepSpeed format: `host slots=N` per line; other key=value (max_slots) read past"))
    gpus_per_node: Procs | list[Procs] | None = Field(None, description=(
        "processes per node: one count for every node, or one per host (default: hostfile slots)"))
    include: str | None = Field(None, description=(
        "deepspeed -i syntax: `worker-0:0,2@worker-1` keeps only these hosts (and slots)"))
    exclude: str | None = Field(None, description="deepspeed -e syntax: drop these hosts or slots")
    first_nodes: int | None = Field(None, ge=1, description=(
        "use only the first N hosts (deepspeed --num_nodes)"))
    cuda_visible_devices: list[int] | list[list[int]] | None = Field(None, description=(
        "GPU indices every node uses, or one list per node: [[0], [1]] runs two nodes on one host"))
    spare_hosts: list[str] = Field(default_factory=list, description=(
        "hosts (the forms of hosts) that take, in order, the place of a node lost or unreachable "
        "before a restart (max_restarts); the node keeps its rank, the world stays the same"))
    min_nodes: int | None = Field(None, ge=1, description=(
        "the fewest nodes a restart may run on: below the node count, a node lost with no spare "
        "left is dropped and grad_accum recomputed to keep the global batch (elastic shrink)"))
    master_addr: str | None = Field(None, description="defaults to the first host")
    master_port: int = Field(29500, ge=1024, le=65535)
    ssh: SSH = SSH()
    env: dict[str, str] = Field(default_factory=dict, description=(
        "extra environment for every rank; $NAME/${NAME} inside a value is the node's own "
        "variable, a whole-value ${NAME} is taken from your shell, $$ is a literal $"))
    setup: list[str] = Field(default_factory=list, description=(
        "shell lines every node runs before torchrun, in the shell that starts it (module load "
        "cuda, source env.sh); a failing line fails that node"))
    python: PathText | None = Field(None, description="remote interpreter; its directory must hold torchrun")
    venv: PathText | None = Field(None, description="remote virtualenv; same as python: VENV/bin/python")
    workdir: PathText | None = None
    shared_dir: PathText | None = Field(None, description="storage every node sees at the same path")
    gpu_memory_gb: float | None = Field(None, gt=0, description=(
        "memory per GPU in GiB (nvidia-smi's MiB / 1024: 80 for an 80 GB H100, 140 for an H200) "
        "for batch planning when no GPU is asked (dry run, --no-preflight); with preflight the "
        "smaller of this and nvidia-smi's figure counts"))
    hangup_after_s: float = Field(30.0, ge=5, le=3600, description=(
        "a node whose launcher is silent this long (no heartbeat) ends its own processes"))
    container: Container | None = Field(None, description=(
        "run each node's torchrun inside this image (docs/containers.md)"))
    warm_start: bool = Field(True, description=(
        "on SSH hosts, start each node's torchrun interpreter (its imports: seconds of CPU) "
        "while mlaunch checks the nodes, and hand it the launch once every check passed; "
        "false: torchrun starts only then"))
    torchrun: Literal["auto", "always"] = Field("auto", description=(
        "auto: a job of one process (1 node x 1 GPU) of LLaMA-Factory without DeepSpeed runs "
        "in-process, without torchrun, as llamafactory-cli does; always: torchrun even then"))

"""cluster.container without running one: the spec's rules (one line each), each node's
runtime line, the container's name, what the teardown and the hang-up guard remove, and the
dry-run. The runs are tests/test_container_runs.py; pyxis and apptainer (not packaged for
Debian 12) are golden files (tests/golden/slurm-qwen2-7b-lora-{pyxis,apptainer})."""
from __future__ import annotations

import copy
import os

import pytest

from launcher.errors import SpecError
from launcher.spec import load_spec, validate

from .helpers import CONFIGS, load_yaml, mlaunch, plan_of, set_path, write_spec

SSH_LORA = os.path.join(CONFIGS, "seed000-qwen2-7b-lora.yaml")
SLURM_LORA = os.path.join(CONFIGS, "slurm", "qwen2-7b-lora.yaml")
IMAGE = "registry.example.com/team/trainer:2026.11"
SECRET = "hf_secret_value_123"   # seed000's HF_TOKEN


def spec(path: str = SSH_LORA, **container) -> dict:
    data = copy.deepcopy(load_yaml(path))
    data["cluster"]["container"] = {"image": IMAGE, **container}
    return data


def problems(data: dict) -> list[str]:
    with pytest.raises(SpecError) as err:
        validate(data)
    return [str(p) for p in err.value.problems]


def plan(data: dict, **kw):
    return plan_of(validate(data), run_id="R", **kw)


CASES = [
    (SSH_LORA, {"runtime": "pyxis"}, "cluster.container.runtime: pyxis does not run under scheduler ssh; use one of podman, docker"),
    (SSH_LORA, {"runtime": "apptainer"}, "cluster.container.runtime: apptainer does not run under scheduler ssh"),
    (SLURM_LORA, {"runtime": "docker"}, "cluster.container.runtime: docker does not run under scheduler slurm; use one of pyxis, apptainer, podman"),
    (SSH_LORA, {"image": "my image"}, "cluster.container.image: 'my image' is not an image name or file"),
    (SSH_LORA, {"image": ""}, "cluster.container.image: '' is not an image name or file"),
    (SSH_LORA, {"mounts": ["data:/data"]}, "cluster.container.mounts[0]: 'data:/data': paths must be absolute"),
    (SSH_LORA, {"mounts": ["/a:/b:rx"]}, "cluster.container.mounts[0]: '/a:/b:rx': unknown option"),
    (SSH_LORA, {"mounts": ["/a,/b"]}, "cluster.container.mounts[0]: '/a,/b': no spaces, commas"),
    (SSH_LORA, {"args": ["--network=bridge"]}, "cluster.container.args[0]: '--network=bridge' is mlaunch's own: NCCL"),
    (SSH_LORA, {"args": ["-e", "X=1"]}, "cluster.container.args[0]: '-e' is mlaunch's own: give the variable in cluster.env"),
    (SSH_LORA, {"args": ["--name", "x"]}, "cluster.container.args[0]: '--name' is mlaunch's own"),
    (SLURM_LORA, {"runtime": "apptainer", "pull": "always"}, "cluster.container.pull: apptainer reads the image as given"),
    (SSH_LORA, {"command": []}, "cluster.container.command: empty"),
    (SSH_LORA, {"args": ["--label=a\nb"]}, "cluster.container.args[0]: contains a newline or NUL character"),
]


@pytest.mark.parametrize("path,block,expected", CASES, ids=[f"{c[1]}"[:50] for c in CASES])
def test_a_bad_container_block_is_one_line(path, block, expected):
    got = problems(spec(path, **block))
    assert len(got) == 1 and got[0].startswith(expected), got


def test_the_cli_refuses_in_one_line_with_exit_2(tmp_path):
    r = mlaunch("submit", write_spec(tmp_path, spec(runtime="pyxis")), "--dry-run")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "cluster.container" in ln]
    assert len(lines) == 1 and "pyxis does not run under scheduler ssh" in lines[0], r.stderr


def test_unknown_container_key_is_refused():
    got = problems(spec(volumes=["/a:/a"]))
    assert len(got) == 1 and "cluster.container.volumes" in got[0], got


def test_podman_line_host_namespaces_mounts_env_by_name_and_a_name_per_node():
    p = plan(spec(mounts=["/data/models:/models:ro"], args=["--shm-size=16g"]))
    n0, n1 = p.nodes[0], p.nodes[1]
    line = n0.container
    assert line.startswith("podman run --rm --name mlaunch-R-a0-n0 --label \"mlaunch.name=\"mlaunch-R-a0-n0 "
                           "--label \"mlaunch.uid=$(id -u)\" --network host --ipc host --uts host --pull missing ")
    assert "--device nvidia.com/gpu=all" in line
    for d in ("/mnt/shared/work:/mnt/shared/work", "/mnt/shared/output/qwen-lora:/mnt/shared/output/qwen-lora",
              "/data/models:/models:ro"):
        assert f"-v {d}" in line
    assert "-w /mnt/shared/work" in line and line.endswith(f"--shm-size=16g {IMAGE}")
    # Every variable by name, the secret's value nowhere on the line; not the host's PATH.
    for name in ("HF_TOKEN", "NCCL_SOCKET_IFNAME", "MLAUNCH_RUN_ID", "MLAUNCH_NODE_ID", "PYTHONUNBUFFERED"):
        assert f"--env {name} " in line
    assert SECRET not in line and "--env PATH" not in line and "=" not in line.split("--env", 1)[1].split(IMAGE)[0].replace("--shm-size=16g", "")
    assert n1.container == line.replace("-n0 ", "-n1 ")
    # The node script execs it around torchrun; its display masks the secret as before.
    assert f"exec {line} /opt/conda/bin/torchrun " in n0.script
    assert SECRET not in n0.display


def test_a_mount_given_as_its_source_alone_is_bound_at_its_own_path():
    # `-v /data` alone is an empty anonymous volume for podman and docker, not the node's /data.
    line = plan(spec(mounts=["/data/models", "/scratch:/scratch:ro"])).nodes[0].container
    assert "-v /data/models:/data/models " in line and "-v /scratch:/scratch:ro " in line
    assert "-v /data/models " not in line


def test_run_dir_outside_the_mounted_dirs_is_mounted_too():
    data = spec(gpus=False)
    del data["cluster"]["workdir"]
    p = plan(data)
    assert f"-v {p.run_dir}:{p.run_dir}" in p.nodes[0].container
    assert "nvidia.com/gpu" not in p.nodes[0].container and "-w " not in p.nodes[0].container


def test_cuda_visible_devices_become_cdi_devices_and_stay_out_of_the_container():
    data = spec()
    data["cluster"]["cuda_visible_devices"] = [2, 3, 4, 5]
    line = plan(data).nodes[0].container
    assert "--device nvidia.com/gpu=2 --device nvidia.com/gpu=3 --device nvidia.com/gpu=4 --device nvidia.com/gpu=5" in line
    assert "--env CUDA_VISIBLE_DEVICES" not in line   # inside, the four are 0-3


def test_docker_gpus_and_command():
    data = spec(runtime="docker", command=["sudo", "-n", "docker"])
    data["cluster"]["cuda_visible_devices"] = [0, 2, 4, 6]
    line = plan(data).nodes[0].container
    assert line.startswith("sudo -n docker run --rm --name mlaunch-R-a0-n0 ")
    assert "--gpus '\"device=0,2,4,6\"'" in line


def test_attempts_get_their_own_container_names():
    p = plan(spec())
    again = p.replanned(attempt=2, resume_from="/x/checkpoint-5")
    assert "--name mlaunch-R-a2-n1 " in again.nodes[1].container
    assert "MLAUNCH_RUN_ID=R+a2" in again.nodes[1].script


def test_teardown_and_hang_up_guard_remove_the_nodes_container():
    from launcher import render
    p = plan(spec(command=["/opt/bin/podman"]))
    n = p.nodes[1]
    # only the container of that name this user started (its labels): a daemon other users
    # share may hold another user's of the same name
    assert n.container_rm == ('/opt/bin/podman rm -f $(/opt/bin/podman ps -aq --filter '
                              '"label=mlaunch.name="mlaunch-R-a0-n1 --filter "label=mlaunch.uid=$(id -u)") '
                              '>/dev/null 2>&1')
    # The hang-up guard's teardown (in the node script) removes this node's container.
    assert '--filter "label=mlaunch.name="mlaunch-R-a0-n1 ' in n.script
    text = render.teardown_script("MLAUNCH_RUN_ID=R", [n.pidfile], 5, containers=[n.container_rm])
    kill = text.index("kill -KILL $p")
    assert text.index(n.container_rm) > kill and text.rstrip().endswith('left"')


def test_without_container_nothing_changes():
    data = copy.deepcopy(load_yaml(SSH_LORA))
    n = plan(data).nodes[0]
    assert n.container == "" and n.container_rm == "" and " rm -f " not in n.script


def test_dry_run_shows_each_nodes_runtime_line_folded(tmp_path):
    r = mlaunch("submit", write_spec(tmp_path, spec()), "--dry-run", "--run-id", "R")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.count("in a container: podman run --rm --name mlaunch-R-a0-n0 ") == 1
    assert "nodes 1–3: as node 0, with --node-rank 1..3" in out
    assert SECRET not in out


def test_podman_under_slurm_removes_its_container_however_the_task_ends():
    data = spec(SLURM_LORA, runtime="podman")
    n = plan(data).nodes[0]
    name = 'mlaunch-R-a0-n"${SLURM_NODEID}"'
    assert f"--name {name} " in n.container
    from launcher import render
    assert f"trap {render.quote(n.container_rm)} EXIT" in n.script
    assert f'--filter "label=mlaunch.name="{name} ' in n.container_rm
    assert "exec podman" not in n.script


def test_apptainer_under_slurm_passes_the_environment_and_binds():
    n = plan(spec(SLURM_LORA, runtime="apptainer", image="/images/t.sif")).nodes[0]
    assert n.container.startswith("apptainer exec --nv --bind /mnt/shared/output/qwen-lora:")
    assert "--env" not in n.container and "--cleanenv" not in n.container
    assert n.container_rm == ""


def test_pyxis_options_go_on_the_batch_scripts_srun_and_the_node_script_runs_torchrun():
    from launcher.backends.slurm import sbatch
    p = plan(spec(SLURM_LORA, runtime="pyxis", image="/images/t.sqsh"))
    req = sbatch.request(p)
    assert "--container-image=/images/t.sqsh --container-name=mlaunch-R-a0 " in req.script
    assert "exec /opt/conda/bin/torchrun" in req.node_script.content
    assert SECRET not in req.script


def test_examples_with_containers_load():
    for name, runtime, image in (("qwen2-7b-lora-pyxis.yaml", "pyxis", "trainer-2026.11.sqsh"),
                                 ("qwen2-7b-lora-apptainer.yaml", "apptainer", "trainer-2026.11.sif")):
        k = load_spec(os.path.join(CONFIGS, "slurm", name)).cluster.container
        assert (k.runtime, k.image, list(k.mounts)) == (
            runtime, f"/mnt/shared/images/{image}", ["/mnt/shared/models:/models:ro"])


def test_stop_removes_every_recorded_attempts_containers_on_each_host():
    """`stop` works from the registry's plans: each node's removal is recorded with it, and the
    sweep of a host removes the containers of that host's nodes, every attempt's."""
    from launcher.backends.ssh import sweep
    from launcher.view.plandata import plan_data
    p = plan(spec())
    data = plan_data(p, "ssh")
    assert data["nodes"][2]["container_rm"] == p.nodes[2].container_rm
    assert '"label=mlaunch.name="mlaunch-R-a0-n2 ' in data["nodes"][2]["container_rm"]

    class Exec:
        def run(self, host, script, timeout):
            self.script = script
            return 0, "mlaunch-teardown: 0 left"
    ex = Exec()
    sweep._host(ex, "h", ["/x/node0.pid"], ["R", "R+a1"], False,
                [p.nodes[2].container_rm, p.nodes[2].container_rm.replace("a0-n2", "a1-n2")])
    assert ex.script.count("mlaunch-R-a0-n2") == 1 and "mlaunch-R-a1-n2" in ex.script
    assert ex.script.rindex("mlaunch-R-a0-n2") > ex.script.rindex("MLAUNCH_RUN_ID=R+a1")


def test_plan_record_without_container_is_unchanged():
    from launcher.view.plandata import plan_data
    data = plan_data(plan(copy.deepcopy(load_yaml(SSH_LORA))), "ssh")
    assert "container" not in data["nodes"][0] and "container_rm" not in data["nodes"][0]


def test_a_universal_checkpoint_conversion_runs_in_the_image():
    """A DeepSpeed resume at another world converts on node 0 with the image's DeepSpeed."""
    from launcher.runs.universal import _in_image
    from launcher import render
    p = plan(spec())
    line = _in_image(p.job, p)
    assert line.startswith("podman run --rm --name mlaunch-R-universal --label \"mlaunch.name=\"mlaunch-R-universal ")
    assert " --network host " in line
    text = render.universal_script(p.nodes[0].env, None, "/opt/conda/bin/python", "/o/checkpoint-5", 8,
                                   container=line)
    assert f"{line} /opt/conda/bin/python -m deepspeed.checkpoint.ds_to_universal" in text
    assert _in_image(plan(copy.deepcopy(load_yaml(SSH_LORA))).job, plan(copy.deepcopy(load_yaml(SSH_LORA)))) is None


def test_removal_takes_only_this_users_container_of_that_name(tmp_path):
    """A rootful daemon shared by two users may hold another user's container of the same name
    (the same --run-id): the removal asks the runtime for the one labelled with the name AND
    this user's id, and removes only that one. A stand-in runtime answers `ps` from a table."""
    import subprocess
    from launcher import render
    me = os.getuid()
    (tmp_path / "table").write_text(f"c-theirs mlaunch-R-a0-n1 {me + 1}\nc-mine mlaunch-R-a0-n1 {me}\n"
                                    f"c-other mlaunch-R-a0-n2 {me}\n")
    runtime = tmp_path / "runtime"
    runtime.write_text(f"""#!/bin/sh
table={tmp_path / 'table'}
case $1 in
ps) name= uid=; shift
    while [ $# -gt 0 ]; do case $1 in --filter) case $2 in label=mlaunch.name=*) name=${{2#label=mlaunch.name=}};;
      label=mlaunch.uid=*) uid=${{2#label=mlaunch.uid=}};; esac; shift;; esac; shift; done
    [ -n "$name" ] && [ -n "$uid" ] || exit 2   # never an unfiltered list
    while read -r id n u; do [ "$n" = "$name" ] && [ "$u" = "$uid" ] && echo "$id"; done < "$table";;
rm) shift; shift; echo "$@" >> {tmp_path / 'removed'};;
esac
""")
    runtime.chmod(0o755)
    r = subprocess.run(["/bin/sh", "-c", render.container_rm([str(runtime)], "mlaunch-R-a0-n1")])
    assert r.returncode == 0
    assert (tmp_path / "removed").read_text() == "c-mine\n"


def test_tokenize_once_is_refused_in_a_container_and_setup_says_where_its_exports_go():
    """tokenize_once would start its tokenizing run on node 0's host with the image's interpreter
    path: refused with the way out. cluster.setup runs in the host's shell: its exports do not
    reach the container (it gets cluster.env's names), and the node script says so."""
    data = spec()
    data["tokenize_once"] = "/nvme/tokenized/x"
    assert any(p.startswith("tokenize_once: with cluster.container the tokenizing run would start on node 0's host")
               for p in problems(data)), problems(data)
    data = spec()
    data["cluster"]["setup"] = ["export NCCL_IB_HCA=mlx5_0"]
    script = plan(data).nodes[0].script
    assert "what it sets stays on this host: the container gets cluster.env" in script
    assert "what it sets reaches the ranks" not in script

"""Job spec validation: the seed examples pass, each kind of mistake gets its one clear line."""
from __future__ import annotations

import glob

import pytest

from launcher.errors import SpecError
from launcher.spec import load_spec, parse_hostfile, validate

from .helpers import CONFIGS, DELETE, seed000, set_path, write_spec


@pytest.mark.parametrize("path", sorted(glob.glob(f"{CONFIGS}/*.yaml")))
def test_every_example_validates(path):
    import yaml
    job = load_spec(path)
    with open(path, encoding="utf-8") as fh:
        cluster = yaml.safe_load(fh)["cluster"]
    if "hosts" in cluster:   # a hostfile's names are parse_hostfile's own test
        assert list(job.cluster.hosts) == [str(h) for h in cluster["hosts"]]
    else:
        assert job.cluster.hosts and "hostfile" in cluster


def test_seed000_exact_values():
    job = validate(seed000())
    assert job.cluster.master_port == 29500 and job.cluster.gpus_per_node == 4
    assert (job.batch.per_device, job.batch.grad_accum, job.batch.global_) == (2, 8, 256)
    assert job.deepspeed.stage == 2 and job.deepspeed.offload_optimizer == "none"


def problems(data: dict) -> list[str]:
    with pytest.raises(SpecError) as err:
        validate(data)
    return [str(p) for p in err.value.problems]


def mutate(path: str, value):
    return set_path(seed000(), path, value)

CASES = [
    ("batch.global", 64, "batch.global: 64 ≠ 4 nodes × 4 GPUs × 2 per device × 8 accumulation = 256"),
    ("cluster.master_port", 80, "cluster.master_port: 80 is too small: write an integer from 1024 to 65535"),
    ("cluster.sshh", {"user": "x"}, "cluster.sshh: unknown key; did you mean 'ssh'?"),
    ("training.learning_rat", 0.1, "training.learning_rat: unknown key; did you mean 'learning_rate'?"),
    ("precision", "bf61", "precision: 'bf61' is not one of bf16, fp16, fp32"),
    ("model", DELETE, "model: required field missing; add `model: /path/to/model`"),
    ("trainer", "llamafactroy", "trainer: 'llamafactroy' is not one of llamafactory, swift, script; did you mean 'llamafactory'?"),
    ("cluster.cuda_visible_devices", [0, 1], "cluster.cuda_visible_devices: 2 devices listed but gpus_per_node is 4"),
    ("cluster.master_addr", "192.168.1.12", "cluster.master_addr: 192.168.1.12 is hosts[2], but node rank 0"),
    ("cluster.master_addr", "127.0.0.1", "cluster.master_addr: 127.0.0.1 is loopback"),
    ("cluster.env", {"MASTER_PORT": "29501"}, "cluster.env.MASTER_PORT: set by mlaunch from cluster.master_port"),
    ("cluster.env", {"BAD-NAME": "1"}, "cluster.env.BAD-NAME: not a valid environment variable name"),
    ("cluster.hosts", ["a", "a"], "cluster.hosts: a listed 2 times: nodes on one host need their own GPUs"),
    ("cluster.cuda_visible_devices", [[0, 1, 2, 3]], "cluster.cuda_visible_devices: 1 device lists for 4 hosts"),
    ("cluster.cuda_visible_devices", [0, 1, 1, 2], "cluster.cuda_visible_devices: [0, 1, 1, 2] lists a GPU twice"),
    ("cluster.cuda_visible_devices", [-1, 0, 1, 2], "cluster.cuda_visible_devices: [-1, 0, 1, 2]: GPU indices start at 0"),
    ("cluster.gpus_per_node", DELETE, "cluster.gpus_per_node: required"),
    ("cluster.cuda_visible_devices", [[0, 1, 2, 3]] * 3 + [[0]],
     "cluster.cuda_visible_devices[3]: 1 devices listed but gpus_per_node is 4"),
    ("cluster.venv", "/opt/v", "cluster.venv: give either python or venv, not both"),
    ("deepspeed", {"stage": 2, "offload_param": "cpu"}, "deepspeed.offload_param: parameter offload exists only in ZeRO-3"),
    ("deepspeed", {"stage": 0, "offload_optimizer": "cpu"}, "deepspeed.offload_optimizer: cpu offload needs ZeRO stage 1, 2 or 3"),
    ("deepspeed", {"stage": 3, "offload_param": "nvme"}, "deepspeed.nvme_path: required when offloading to nvme"),
    ("finetuning", {"type": "full", "lora_rank": 8}, "finetuning.lora_rank: only applies to type lora, but type is full"),
    ("training.max_steps", 100, "training: give exactly one of epochs or max_steps"),
    ("training.warmup_steps", 10, "training.warmup_steps: give warmup_ratio or warmup_steps, not both"),
    ("passthrough", {"per_device_train_batch_size": 4}, "passthrough.per_device_train_batch_size: mlaunch owns this key; set batch.per_device instead"),
    ("passthrough", {"deepspeed": "ds.json"}, "passthrough.deepspeed: mlaunch renders the DeepSpeed config"),
    ("passthrough", {"use_cpu": True}, "passthrough.use_cpu: not needed on CPU hosts"),
    ("passthrough", {"bad key": 1}, "passthrough.bad key: not a LLaMA-Factory argument name"),
    ("cluster.env", {"ACCELERATE_USE_CPU": "true"}, "cluster.env.ACCELERATE_USE_CPU: not needed on CPU hosts"),
    ("model", "/data/x\nrm -rf ~", "model: contains a newline or NUL character"),
    ("name", "bad name!", "name: 'bad name!' must be letters, digits"),
]


@pytest.mark.parametrize("path,value,expected", CASES, ids=[c[0] + "=" + repr(c[1])[:20] for c in CASES])
def test_each_mistake_has_its_line(path, value, expected):
    lines = problems(mutate(path, value))
    assert any(line.startswith(expected) for line in lines), lines


def two_nodes_one_host(devices):
    data = mutate("cluster.hosts", ["localhost", "localhost"])
    data["cluster"].pop("master_addr", None)
    data["cluster"]["gpus_per_node"] = 1
    data["cluster"]["cuda_visible_devices"] = devices
    data["batch"] = {"per_device": 2, "grad_accum": 1}
    return data


def test_two_nodes_on_one_host_with_their_own_gpus():
    from launcher.plan.launch_plan import build_plan
    plan = build_plan(validate(two_nodes_one_host([[0], [1]])), run_id="r")
    assert [dict(n.env)["CUDA_VISIBLE_DEVICES"] for n in plan.nodes] == ["0", "1"]
    assert [n.argv[n.argv.index("--node-rank") + 1] for n in plan.nodes] == ["0", "1"]
    assert len({n.pidfile for n in plan.nodes}) == len({n.log_path for n in plan.nodes}) == 2


def test_two_loopback_names_are_one_host():
    data = two_nodes_one_host([[0], [0]])
    data["cluster"]["hosts"] = ["localhost", "127.0.0.1"]
    assert problems(data) == ["cluster.cuda_visible_devices[1]: GPU 0 on localhost / 127.0.0.1 is "
                              "also node 0's; nodes on one host must use disjoint GPUs"]


def test_two_nodes_on_one_host_sharing_a_gpu_is_refused():
    lines = problems(two_nodes_one_host([[0], [0]]))
    assert lines == ["cluster.cuda_visible_devices[1]: GPU 0 on localhost is also node 0's; "
                     "nodes on one host must use disjoint GPUs"], lines


def test_zero2_without_offload_is_valid():
    # Seed 000 claims ZeRO-2 "must" offload to CPU; DeepSpeed does not require it.
    for stage in (1, 2, 3):
        assert validate(mutate("deepspeed", {"stage": stage})).deepspeed.offload_optimizer == "none"
    assert validate(mutate("deepspeed", {"stage": 1, "offload_optimizer": "cpu"}))


def test_all_problems_reported_at_once():
    data = mutate("batch.global", 64)
    data["cluster"]["env"]["MASTER_ADDR"] = "x"
    data["training"]["max_steps"] = 5
    assert len(problems(data)) == 3


def test_secret_value_never_in_error():
    data = mutate("cluster.env", {"HF_TOKEN": ["hf_secret_value_123"]})
    lines = problems(data)
    assert lines and not any("hf_secret_value_123" in line for line in lines)


def test_script_job_rejects_llamafactory_fields():
    data = {"name": "s", "trainer": "script", "cluster": {"hosts": ["h"], "gpus_per_node": 1},
            "script": {"module": "x"}, "batch": {"per_device": 1}}
    assert "batch: unknown key" in problems(data)[0]
    data.pop("batch")
    data["script"] = {"module": "x", "path": "/y.py"}
    assert problems(data)[0].startswith("script: give exactly one of path")


def test_hostfile(tmp_path):
    (tmp_path / "hosts").write_text("# cluster\nnode1 slots=4\n\nnode2 slots=4  # second\n")
    data = seed000()
    data["cluster"].pop("hosts")
    data["cluster"].pop("gpus_per_node")
    data["cluster"].pop("master_addr")
    data["cluster"]["hostfile"] = "hosts"
    data["batch"]["global"] = 2 * 4 * 2 * 8
    job = load_spec(write_spec(tmp_path, data))
    assert job.cluster.hosts == ["node1", "node2"] and job.cluster.gpus_per_node == 4


def test_hostfile_problems():
    hosts, slots, probs, _ = parse_hostfile("a slots=2\nb slots=x\nc\n", "hf")
    assert hosts == ["a", "c"] and slots == [2, None]
    assert str(probs[0]).startswith("hf:2: expected `host slots=N`")


def test_hostfile_uneven_slots(tmp_path):
    """Mixed slot counts are one process count per node; the batch arithmetic sums them."""
    (tmp_path / "hosts").write_text("a slots=4\nb slots=8\n")
    data = seed000()
    for k in ("hosts", "gpus_per_node", "master_addr"):
        data["cluster"].pop(k)
    data["cluster"]["hostfile"] = "hosts"
    with pytest.raises(SpecError) as err:
        load_spec(write_spec(tmp_path, data))
    assert ("batch.global: 256 ≠ 12 GPUs (4+8 on 2 nodes) × 2 per device × 8 accumulation = 192; "
            "set global to 192") in str(err.value)
    data["batch"]["global"] = 192
    assert load_spec(write_spec(tmp_path, data)).cluster.gpus_per_node == [4, 8]


def test_yaml_errors_have_line_and_column(tmp_path):
    p = tmp_path / "j.yaml"
    p.write_text("name: x\ncluster:\n  hosts: [a\n")
    with pytest.raises(SpecError) as err:
        load_spec(str(p))
    assert f"{p}:4:1: YAML syntax" in str(err.value) or f"{p}:3:" in str(err.value)


def test_duplicate_yaml_keys_rejected(tmp_path):
    p = tmp_path / "j.yaml"
    p.write_text("name: x\nname: y\n")
    with pytest.raises(SpecError) as err:
        load_spec(str(p))
    assert "duplicate key 'name' (first at line 1)" in str(err.value)

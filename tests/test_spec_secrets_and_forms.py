"""Spec validation: secrets outside cluster.env, union errors collapsed to one
line with the accepted forms, the deepspeed/ddp forms people bring, numbers in script.args,
no false lines derived from an invalid cluster, one line for a misspelt required key."""
from __future__ import annotations

import copy
import os

import pytest

from .helpers import plan_of

from launcher.errors import SpecError
from launcher.spec import validate
from tests.helpers import CONFIGS, DELETE, load_yaml, mlaunch, seed000, set_path, write_spec

SECRET = "hf_abcdefSECRET"


def problems(data: dict) -> list[str]:
    with pytest.raises(SpecError) as err:
        validate(data)
    return [str(p) for p in err.value.problems]


def mutate(path: str, value) -> dict:
    return set_path(seed000(), path, value)


def script_spec(args: list) -> dict:
    spec = copy.deepcopy(load_yaml(os.path.join(CONFIGS, "allreduce-2x2.yaml")))
    spec["script"]["args"] = args
    return spec


def swift_spec() -> dict:
    return copy.deepcopy(load_yaml(os.path.join(CONFIGS, "seed003-qwen2.5-14b-swift-lora.yaml")))


# --- A: secrets -------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["hub_token", "hf_hub_token", "ms_hub_token", "swanlab_api_key"])
def test_secret_passthrough_refused_llamafactory(key):
    lines = problems(mutate("passthrough", {key: SECRET}))
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"passthrough.{key}: a secret here lands in llamafactory.yaml")
    assert "cluster.env" in lines[0] and SECRET not in lines[0]


def test_secret_passthrough_names_the_variable():
    line, = problems(mutate("passthrough", {"hf_hub_token": SECRET}))
    assert "HF_TOKEN" in line


def test_secret_passthrough_refused_swift():
    line, = problems(set_path(swift_spec(), "passthrough", {"hub_token": SECRET}))
    assert line.startswith("passthrough.hub_token: a secret here lands in ms-swift's command line")
    assert "MODELSCOPE_API_TOKEN" in line and "HF_TOKEN" in line


@pytest.mark.parametrize("key", ["max_new_tokens", "ignore_pad_token_for_loss", "add_special_tokens"])
def test_token_counting_passthrough_keys_still_validate(key):
    assert validate(mutate("passthrough", {key: 1})).passthrough[key] == 1


def test_secret_passthrough_never_reaches_dry_run_or_render(tmp_path):
    path = write_spec(tmp_path, mutate("passthrough", {"hub_token": SECRET}))
    for args in (["submit", path, "--dry-run"], ["render", path, "--out", str(tmp_path / "r")]):
        r = mlaunch(*args, cwd=str(tmp_path))
        assert r.returncode == 2, r.stderr
        assert "passthrough.hub_token" in r.stderr and "Traceback" not in r.stderr
        assert SECRET not in r.stdout + r.stderr
    assert not (tmp_path / "r").exists() or SECRET not in "".join(
        p.read_text() for p in (tmp_path / "r").rglob("*") if p.is_file())


@pytest.mark.parametrize("args,index", [
    (["--hf-token", SECRET], 1), ([f"--hf-token={SECRET}"], 0), (["--api_key", SECRET], 1),
    (["--size-mb", "64", "--password", SECRET], 3), (["--wandb-secret", SECRET], 1),
])
def test_secret_script_arg_refused(args, index):
    line, = problems(script_spec(args))
    assert line.startswith(f"script.args[{index}]: the value of --") and "cluster.env" in line
    assert SECRET not in line


@pytest.mark.parametrize("args", [["--max-new-tokens", "5"], ["--token-file", "/x"],
                                  ["--tokenizer", "gpt2"]])
def test_token_flags_that_are_not_secrets_pass(args):
    assert validate(script_spec(args)).script.args == args


def test_env_reference_taken_from_the_shell(monkeypatch):
    monkeypatch.setenv("MLAUNCH_TEST_TOKEN", SECRET)
    raw = mutate("cluster.env", {"HF_TOKEN": "${MLAUNCH_TEST_TOKEN}", "OTHER": "a${X}b"})
    job = validate(raw)
    assert job.cluster.env == {"HF_TOKEN": SECRET, "OTHER": "a${X}b"}
    assert raw["cluster"]["env"]["HF_TOKEN"] == "${MLAUNCH_TEST_TOKEN}"  # the caller's dict unchanged


def test_env_reference_unset_is_one_line(monkeypatch):
    monkeypatch.delenv("MLAUNCH_TEST_UNSET", raising=False)
    assert problems(mutate("cluster.env", {"HF_TOKEN": "${MLAUNCH_TEST_UNSET}"})) == [
        "cluster.env.HF_TOKEN: ${MLAUNCH_TEST_UNSET} is not set in this shell: "
        "export MLAUNCH_TEST_UNSET=… in the shell that runs mlaunch (the value never goes into the spec file)"]


def test_env_reference_masked_in_dry_run(tmp_path):
    path = write_spec(tmp_path, mutate("cluster.env", {"HF_TOKEN": "${MLAUNCH_TEST_TOKEN}"}))
    r = mlaunch("submit", path, "--dry-run", "--full", cwd=str(tmp_path),
                env={"MLAUNCH_TEST_TOKEN": SECRET})
    assert r.returncode == 0, r.stderr
    assert SECRET not in r.stdout + r.stderr and "export HF_TOKEN='***'" in r.stdout
    r = mlaunch("submit", path, "--dry-run", cwd=str(tmp_path), env={"MLAUNCH_TEST_TOKEN": ""})
    assert r.returncode == 0  # set but empty is set


# --- B: union errors --------------------------------------------------------------------

@pytest.mark.parametrize("path,value,expected", [
    ("cluster.gpus_per_node", "two", "cluster.gpus_per_node: 'two' is not accepted: write an "
     "integer from 1 to 1024, or a list of them, or leave it out; processes per node: one count "
     "for every node, or one per host"),
    ("cluster.gpus_per_node", 0, "cluster.gpus_per_node: 0 is not accepted: write an integer from 1 to 1024"),
    ("batch.per_device", 0, "batch.per_device: 0 is not accepted: write an integer ≥ 1, or auto, or leave it out"),
    ("batch.grad_accum", "x", "batch.grad_accum: 'x' is not accepted: write an integer ≥ 1, or auto"),
])
def test_union_mistake_is_one_line_with_the_forms(path, value, expected):
    lines = problems(mutate(path, value))
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert "constrained" not in lines[0] and "literal[" not in lines[0]


def test_union_list_branch_names_the_bad_item():
    lines = problems(mutate("cluster.gpus_per_node", [4, 4, "x", 4]))
    assert lines == ["cluster.gpus_per_node[2]: 'x' is not an integer: write an integer from 1 to 1024"]


def test_yaml_boolean_where_text_belongs_says_quote_it():
    line, = problems(mutate("template", True))
    assert line.startswith("template: True is a YAML boolean") and "quote it" in line


# --- C: deepspeed / ddp -----------------------------------------------------------------

@pytest.mark.parametrize("value,expected", [
    ("ds_z2_config.json", "deepspeed: 'ds_z2_config.json' is a file name: write `deepspeed: {config: ds_z2_config.json}`"),
    ("zero2", "deepspeed: 'zero2' is a ZeRO stage: write `deepspeed: {stage: 2}`"),
    ("zero3_offload", "deepspeed: 'zero3_offload' is a ZeRO stage: write `deepspeed: {stage: 3, offload_optimizer: cpu, offload_param: cpu}`"),
])
def test_deepspeed_string_on_llamafactory(value, expected):
    assert problems(mutate("deepspeed", value)) == [expected]


def test_raw_deepspeed_block_points_at_config_file():
    line, = problems(mutate("deepspeed", {"zero_optimization": {"stage": 2}}))
    assert line.startswith("deepspeed.zero_optimization: unknown key: zero_optimization is DeepSpeed's own JSON")
    assert "deepspeed: {config: FILE}" in line and "deepspeed: {stage: N}" in line


def test_deepspeed_typo_still_gets_did_you_mean():
    assert problems(mutate("deepspeed", {"stag": 2})) == ["deepspeed.stag: unknown key; did you mean 'stage'?"]


def test_ddp_key_says_ddp_is_the_default():
    line, = problems(set_path(mutate("ddp", True), "deepspeed", DELETE))
    assert line.startswith("ddp: unknown key: mlaunch runs plain DDP when `deepspeed`")


# --- D: numbers in script.args ----------------------------------------------------------

def test_script_numbers_pass_as_text():
    job = validate(script_spec(["--epochs", 3, "--lr", 0.5]))
    assert job.script.args == ["--epochs", "3", "--lr", "0.5"]


def test_script_boolean_arg_asks_for_quotes():
    assert problems(script_spec(["--flag", True])) == [
        "script.args[1]: True is a YAML boolean (true/false/yes/no/on/off), not text: quote it, e.g. \"True\""]


def test_script_error_path_keeps_script_prefix():
    assert problems(script_spec(["--x", [1]]))[0].startswith("script.args[1]: ")


# --- E: no checks derived from an invalid cluster shape --------------------------------

def test_wrong_length_gpu_list_gives_only_its_own_line():
    data = mutate("cluster.hosts", ["192.168.1.10"])
    data["cluster"]["gpus_per_node"] = [2, 2]
    data["batch"] = {"per_device": 2, "grad_accum": 2, "global": 16}
    assert problems(data) == ["cluster.gpus_per_node: 2 counts for 1 hosts; give one count, or "
                              "one per host in host order"]


# --- F: misspelt required key -----------------------------------------------------------

@pytest.mark.parametrize("parent,good,bad", [("training", "learning_rate", "learnig_rate"),
                                             ("", "model", "modle"), ("finetuning", "type", "typ")])
def test_misspelt_required_key_is_one_line(parent, good, bad):
    data = seed000()
    node = data[parent] if parent else data
    node[bad] = node.pop(good)
    where = f"{parent}.{bad}" if parent else bad
    assert problems(data) == [f"{where}: unknown key; did you mean '{good}'?"]


def test_missing_required_key_without_typo_still_reported():
    assert problems(mutate("training.learning_rate", DELETE)) == ["training.learning_rate: required field missing; add `learning_rate: 1.0e-4` under training"]


def test_swift_deepspeed_file_name_points_at_config():
    assert problems(set_path(swift_spec(), "deepspeed", "ds_z2_config.json")) == [
        "deepspeed.name: 'ds_z2_config.json' is a file name: write `deepspeed: {config: ds_z2_config.json}`"]


def test_swift_raw_deepspeed_block_points_at_config_file():
    line, = problems(set_path(swift_spec(), "deepspeed", {"zero_optimization": {"stage": 3}}))
    assert "deepspeed: {config: FILE}" in line


def test_misspelt_trainer_key_is_named():
    data = seed000()
    data["trainr"] = data.pop("trainer")
    assert problems(data) == ["trainer: required: one of llamafactory, swift, script; add e.g. "
                              "`trainer: llamafactory`; did you misspell it as 'trainr'?"]


@pytest.mark.parametrize("path,value,expected", [
    ("finetuning.lora_target", 5, "finetuning.lora_target: 5 is not accepted: write text, or a list of them"),
    ("cluster.slurm", {"extra_sbatch": {"mem": [1]}},
     "cluster.slurm.extra_sbatch.mem: [1] is not accepted: write text, or an integer, or true or false"),
])
def test_forms_through_lists_and_mappings(path, value, expected):
    assert problems(mutate(path, value)) == [expected]


def test_secret_reference_under_a_plain_name_is_a_secret(monkeypatch):
    """A `${NAME}` value is a secret whatever the env name: masked in the display and the snapshot."""
    from launcher.plan.launch_plan import build_plan
    from launcher.record.recorder import spec_snapshot
    from launcher.spec import validate
    monkeypatch.setenv("MLAUNCH_TEST_TOKEN", SECRET)
    job = validate(mutate("cluster.env", {"HUB": "${MLAUNCH_TEST_TOKEN}"}))
    plan = plan_of(job, run_id="r")
    assert SECRET in plan.nodes[0].script and SECRET not in plan.nodes[0].display
    assert spec_snapshot(job)["cluster"]["env"]["HUB"] == "***"


def test_numbers_in_script_args_pass_as_written_not_as_yaml_reads_them(tmp_path):
    """YAML 1.1 reads 010 as 8, 0x10 as 16, 1:30 as 90, 1_000 as 1000, 1.50 as 1.5: the
    script gets the text the spec holds (before, the dry run and torchrun showed 8, 16, 90...);
    an override's numbers too, and its note shows them as written."""
    from .helpers import mlaunch, write_spec
    spec = {"name": "t", "trainer": "script", "cluster": {"hosts": ["localhost"], "gpus_per_node": 1},
            "script": {"path": "/x/train.py"}, "output_dir": str(tmp_path / "out")}
    path = tmp_path / "job.yaml"
    path.write_text(open(write_spec(tmp_path, spec)).read()
                    + "\n# numbers as a user writes them\n")
    text = path.read_text().replace("path: /x/train.py", "path: /x/train.py\n  args: [--a, 010, --b, 0x10, "
                                    "--c, 1:30, --d, 1_000, --e, 1.50, --f, 3]")
    path.write_text(text)
    r = mlaunch("submit", str(path), "--dry-run", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    import json
    argv = json.loads(r.stdout)["nodes"][0]["argv"]
    assert argv[-12:] == ["--a", "010", "--b", "0x10", "--c", "1:30", "--d", "1_000", "--e", "1.50", "--f", "3"]
    r = mlaunch("submit", str(path), "--dry-run", "script.args=[--g, 0o17]")
    assert r.returncode == 0 and "train.py --g 0o17" in r.stdout, r.stdout + r.stderr
    assert "note: override script.args=[--g, 0o17]" in r.stdout

"""Bad input a reviewer tried on 2026-12-06 that got through or got a wrong line: secrets echoed
or let into cluster.setup, `$NAME` for a secret, YAML booleans read as numbers, a Ray address
with no host, overrides blamed or worded wrongly, unknown keys with no fix. Each case runs the
real CLI (exit 2, one line per problem, no traceback, the secret never printed) or validate()."""
from __future__ import annotations

import copy
import os

import pytest

from launcher.errors import SpecError
from launcher.spec import validate
from tests.helpers import CONFIGS, load_yaml, mlaunch, seed000, set_path, write_spec

TOKEN = "hf_QzXyAbCdEfGhIjKlMnOpQrStUvWxYz012345"


def problems(data: dict) -> list[str]:
    with pytest.raises(SpecError) as err:
        validate(data)
    return [str(p) for p in err.value.problems]


def refused(tmp_path, data: dict, *overrides: str) -> list[str]:
    """The CLI's problem lines for a dry run of data: exit 2, no traceback, no token shown."""
    r = mlaunch("submit", "--dry-run", write_spec(tmp_path, data), *overrides,
                env={"MLAUNCH_HOME": str(tmp_path / "home")})
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "Traceback" not in out and TOKEN not in out, out
    return [line for line in r.stderr.splitlines() if not line.endswith("invalid job spec")
            and not line.endswith("invalid override on the command line")]


# --- secrets -----------------------------------------------------------------------------

def test_env_written_as_a_list_is_refused_without_showing_the_token(tmp_path):
    line, = refused(tmp_path, set_path(seed000(), "cluster.env", [f"HF_TOKEN={TOKEN}", "A=1"]))
    assert line.startswith("mlaunch: cluster.env: ['HF_TOKEN=***', 'A=1'] is a list: write one NAME: value")


@pytest.mark.parametrize("line, flag, env", [
    (f"huggingface-cli login --token {TOKEN}", "--token", "HF_TOKEN"),
    (f"tool --hf-token={TOKEN}", "--hf-token", "HF_TOKEN"),
    (f"wandb login --api-key {TOKEN}", "--api-key", "API_KEY"),
])
def test_a_secret_flag_with_a_literal_value_in_setup_is_refused(tmp_path, line, flag, env):
    got, = refused(tmp_path, set_path(seed000(), "cluster.setup", [line]))
    assert got.startswith(f"mlaunch: cluster.setup[0]: gives {flag} a literal value"), got
    assert f"{env}: ${{{env}}}" in got and f"drop {flag} where the tool reads {env} from its environment" in got
    assert "every user of the node reads in /proc" in got   # why not `--token "$HF_TOKEN"`


@pytest.mark.parametrize("line, flag, env", [
    ('huggingface-cli login --token "$HF_TOKEN"', "--token", "HF_TOKEN"),
    ("tool --token=${HF_TOKEN}", "--token", "HF_TOKEN"),
    ("wandb login --api-key $WANDB_API_KEY", "--api-key", "WANDB_API_KEY"),
    ("tool --api-key $(cat /run/key)", "--api-key", "API_KEY"),
])
def test_a_secret_flag_given_a_reference_in_setup_is_refused(tmp_path, line, flag, env):
    """The node's shell expands the reference onto the command's argv (/proc/<pid>/cmdline)."""
    got, = refused(tmp_path, set_path(seed000(), "cluster.setup", [line]))
    assert got.startswith(f"mlaunch: cluster.setup[0]: gives {flag} $"), got
    assert "every user of the node reads it in /proc" in got
    assert f"drop {flag} and let the tool read {env} from its environment" in got
    assert f"{env}: ${{{env}}} in cluster.env" in got and "stdin or in a file" in got


@pytest.mark.parametrize("line", ["run --max-new-tokens 5", "tool --token-file /run/x",
                                  'huggingface-cli download "$MODEL_ID"'])
def test_setup_lines_without_a_secret_flag_pass(line):
    job = validate(set_path(seed000(), "cluster.setup", [line]))
    assert list(job.cluster.setup) == [line]


@pytest.mark.parametrize("name, value, ref", [("HF_TOKEN", "$HF_TOKEN", "HF_TOKEN"),
                                              ("WANDB_API_KEY", "${WANDB_API_KEY:-}", "WANDB_API_KEY"),
                                              ("MY_SECRET", "$OTHER", "OTHER")])
def test_a_secret_given_as_a_shell_reference_is_refused(name, value, ref):
    line, = problems(set_path(seed000(), f"cluster.env.{name}", value))
    assert line.startswith(f"cluster.env.{name}: a reference the ranks would get as those characters")
    assert f"write {name}: ${{{ref}}}" in line


def test_a_secret_with_a_dollar_inside_is_still_taken_as_written():
    job = validate(set_path(seed000(), "cluster.env.HF_TOKEN", "ab$cd$ef"))
    assert job.cluster.env["HF_TOKEN"] == "ab$cd$ef"


@pytest.mark.parametrize("override", [f"cluster.HF_TOKEN={TOKEN}", f"cluster.master_port={TOKEN}",
                                      f"cluster.env.X={{{TOKEN}"])
def test_an_override_s_token_is_masked_in_its_error(tmp_path, override):
    lines = refused(tmp_path, seed000(), override)
    assert lines and all("***" in line for line in lines), lines


def test_a_token_in_any_field_is_masked_in_its_error(tmp_path):
    line, = refused(tmp_path, set_path(seed000(), "cluster.gpus_per_node", TOKEN))
    assert line.startswith("mlaunch: cluster.gpus_per_node: *** is not accepted")


# --- numbers, addresses ------------------------------------------------------------------

@pytest.mark.parametrize("path, fix", [("cluster.ssh.port", "an integer from 1 to 65535"),
                                       ("training.epochs", "a number > 0"),
                                       ("finetuning.lora_rank", "an integer ≥ 1"),
                                       ("cluster.gpus_per_node", "an integer from 1 to 1024")])
def test_a_yaml_boolean_is_no_number(path, fix):
    line, = problems(set_path(seed000(), path, True))
    assert line.startswith(f"{path}: true is a YAML boolean (true/false/yes/no/on/off), not a number: "
                           f"write {fix}"), line


def test_a_yaml_boolean_still_fills_a_boolean_field():
    job = validate(set_path(seed000(), "cluster.ssh.strict_host_keys", False))
    assert job.cluster.ssh.strict_host_keys is False


def ray_spec(address: str) -> dict:
    spec = copy.deepcopy(load_yaml(os.path.join(CONFIGS, "allreduce-2x2.yaml")))
    spec["cluster"] = {"scheduler": "ray", "gpus_per_node": 1, "ray": {"address": address, "nodes": 2}}
    return spec


@pytest.mark.parametrize("address", ["ray://:99999", "h:0", "ray://h:70000", "a b"])
def test_a_ray_address_without_a_host_or_with_a_port_out_of_range_is_refused(address):
    lines = [p for p in problems(ray_spec(address)) if p.startswith("cluster.ray.address")]
    assert len(lines) == 1 and "a port from 1 to 65535" in lines[0], lines


@pytest.mark.parametrize("address", ["auto", "ray://head:10001", "head:6379", "ray://[::1]:10001",
                                     "ray://svc.ns.svc.cluster.local:10001"])
def test_ray_addresses_people_write_pass(address):
    assert validate(ray_spec(address)).cluster.ray.address == address


# --- overrides and unknown keys ----------------------------------------------------------

def test_the_last_of_two_overrides_of_a_key_is_the_one_named(tmp_path):
    line, = refused(tmp_path, seed000(), "training.learning_rate=1e-5", "training.learning_rate=abc")
    assert line.endswith("(set by the override training.learning_rate=abc)"), line


def test_a_list_item_override_says_to_write_the_whole_list(tmp_path):
    line, = refused(tmp_path, seed000(), "cluster.hosts[5]=x")
    assert "a list's items are not set one by one; write the whole list, e.g. cluster.hosts='[a, b]'" in line


def test_deepspeed_given_as_its_flag_is_told_the_file_alone():
    line, = problems(set_path(seed000(), "deepspeed", "--deepspeed ds_z3.json"))
    assert "write `deepspeed: {config: ds_z3.json}`; mlaunch writes the --deepspeed flag itself" in line


@pytest.mark.parametrize("key, value, fix", [
    ("gradient_accumulation_steps", 8, "LLaMA-Factory's gradient_accumulation_steps is batch.grad_accum in this spec"),
    ("resume_from_checkpoint", True, "is mlaunch's --resume flag"),
    ("neftune_noise_alpha", 5, "write passthrough: {neftune_noise_alpha: ...}"),
    ("hf_token", "x", "a secret goes in cluster.env only"),
    ("zzz_not_a_thing", 1, "remove it, or check its spelling (`mlaunch schema` lists every key)"),
])
def test_every_unknown_key_gets_a_fix(key, value, fix):
    line, = problems(set_path(seed000(), key, value))
    assert line.startswith(f"{key}: unknown key") and fix in line, line


def test_a_near_miss_of_a_trainer_name_inside_a_section_is_pointed_home():
    line, = problems(set_path(seed000(), "batch.gradient_acumulation_steps", 8))
    assert "'gradient_accumulation_steps' (LLaMA-Factory's) is batch.grad_accum in this spec" in line


# --- files and flags ---------------------------------------------------------------------

def test_a_spec_in_a_symlink_loop_gets_a_fix(tmp_path):
    os.symlink(tmp_path / "b.yaml", tmp_path / "a.yaml")
    os.symlink(tmp_path / "a.yaml", tmp_path / "b.yaml")
    r = mlaunch("validate", str(tmp_path / "a.yaml"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().endswith("cannot read the spec: Too many levels of symbolic links; "
                                     "give the path of a readable YAML file"), r.stderr


@pytest.mark.parametrize("flag, key", [("--deepspeed", "deepspeed.config=FILE"),
                                       ("--nproc_per_node", "cluster.gpus_per_node"),
                                       ("--master_addr", "cluster.master_addr")])
def test_another_launcher_s_flag_names_the_spec_key(tmp_path, flag, key):
    r = mlaunch("submit", "--dry-run", os.path.join(CONFIGS, "seed000-qwen2-7b-lora.yaml"), flag, "x",
                env={"MLAUNCH_HOME": str(tmp_path / "home")})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"Error: No such option '{flag}'" in r.stderr
    assert f"mlaunch: {flag} is another launcher's flag: mlaunch takes " in r.stderr and key in r.stderr


def test_ddp_only_options_under_deepspeed_get_a_note_and_are_kept():
    spec = set_path(seed000(), "passthrough", {"ddp_find_unused_parameters": True, "ddp_bucket_cap_mb": 25})
    job = validate(spec)
    notes = [n for n in job._notes if "DeepSpeed replaces" in n]
    assert [n.split(":")[0] for n in notes] == ["passthrough.ddp_find_unused_parameters",
                                                "passthrough.ddp_bucket_cap_mb"]
    assert job.passthrough["ddp_bucket_cap_mb"] == 25
    del spec["deepspeed"]
    assert not [n for n in validate(spec)._notes if "DeepSpeed replaces" in n]


def test_a_secret_read_from_the_shell_may_itself_look_like_a_reference(monkeypatch):
    monkeypatch.setenv("MLAUNCH_T_REVIEW", "$ecret1")
    job = validate(set_path(seed000(), "cluster.env.HF_TOKEN", "${MLAUNCH_T_REVIEW}"))
    assert job.cluster.env["HF_TOKEN"] == "$ecret1"


# --- runs: what a runtime-error review found -----------------------------------------------

def script_job_spec(tmp_path) -> dict:
    return {"name": "t-review", "trainer": "script", "script": {"path": "/abs/x.py"},
            "cluster": {"hosts": ["localhost"], "gpus_per_node": 1}, "output_dir": str(tmp_path / "out")}


@pytest.mark.parametrize("argv", [["submit", "--dry-run", "--resume"], ["resume", "--dry-run"]])
def test_resume_of_a_trainer_without_checkpoints_is_refused_by_the_dry_run_too(tmp_path, argv):
    path = write_spec(tmp_path, script_job_spec(tmp_path))
    r = mlaunch(argv[0], path, *argv[1:], env={"MLAUNCH_HOME": str(tmp_path / "home")})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert r.stderr.strip() == "mlaunch: --resume needs a trainer that writes checkpoints; trainer script does not"


def test_a_dry_run_refuses_a_run_id_the_registry_holds_and_writes_no_registry(tmp_path):
    home = str(tmp_path / "home")
    path = write_spec(tmp_path, script_job_spec(tmp_path))
    r = mlaunch("submit", "--dry-run", path, "--run-id", "rv-held", env={"MLAUNCH_HOME": home})
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(os.path.join(home, "runs.db"))   # a dry run creates no registry
    from launcher.record.registry import Registry
    reg = Registry(os.path.join(home, "runs.db"))
    reg.create("rv-held", name="t-review", backend="local", hosts=["localhost"], spec={},
               detached=False, supervisor=(os.getpid(), None), log_dir=None, output_dir=None)
    reg.close()
    r = mlaunch("submit", "--dry-run", path, "--run-id", "rv-held", env={"MLAUNCH_HOME": home})
    assert r.returncode == 2 and r.stderr.startswith("mlaunch: --run-id 'rv-held': taken by an earlier run (job t-review,"), r.stderr


def test_report_of_an_empty_run_or_a_nan_window_is_one_line(tmp_path):
    env = {"MLAUNCH_HOME": str(tmp_path / "home")}
    r = mlaunch("report", "", env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "RUN '': empty" in r.stderr, r.stderr
    r = mlaunch("report", "x", "--window", "nan", env=env)
    assert r.returncode == 2 and "'nan' is not a finite number of seconds" in r.stderr, r.stderr


def test_render_into_a_directory_of_the_user_s_keeps_their_files(tmp_path):
    path = write_spec(tmp_path, script_job_spec(tmp_path))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "node0.sh").write_text("my own notes\n")
    r = mlaunch("render", path, "--out", str(mine), env={"MLAUNCH_HOME": str(tmp_path / "home")})
    assert r.returncode == 2 and "holds node0.sh, which render did not write" in r.stderr, r.stderr
    assert (mine / "node0.sh").read_text() == "my own notes\n"
    fresh = tmp_path / "fresh"
    for _ in range(2):   # its own directory: rendered again in place
        r = mlaunch("render", path, "--out", str(fresh), env={"MLAUNCH_HOME": str(tmp_path / "home")})
        assert r.returncode == 0 and (fresh / "node0.sh").read_text().startswith("#"), r.stderr


@pytest.mark.parametrize("args, says", [
    (["--", ""], "exec: no CMD; put the command after --"),
    (["--", "   "], "exec: no CMD; put the command after --"),
    (["hostname"], "exec: 'hostname' is not KEY=VALUE; put the command after --, e.g. mlaunch exec job.yaml -- hostname"),
])
def test_exec_without_a_command_after_the_dashes_runs_nothing(tmp_path, args, says):
    path = write_spec(tmp_path, script_job_spec(tmp_path))
    r = mlaunch("exec", path, *args, env={"MLAUNCH_HOME": str(tmp_path / "home")})
    assert r.returncode == 2 and r.stderr.startswith(f"mlaunch: {says}"), r.stderr


# --- a reviewer's fresh-user trial, 2026-12-07 --------------------------------------------

def test_a_number_given_by_an_override_gets_the_quotes_as_the_shell_must_pass_them(tmp_path):
    """`cluster.env.NCCL_DEBUG="1"` reaches mlaunch as NCCL_DEBUG=1 (the shell takes the
    quotes): the fix shows them inside the shell's own, and that form is taken."""
    data = set_path(seed000(), "cluster.env", {"A": "1"})
    got, = refused(tmp_path, data, "cluster.env.NCCL_DEBUG=1")
    assert got == ("mlaunch: cluster.env.NCCL_DEBUG: 1 is a YAML number, not text: quote it inside the "
                   "shell's quotes, e.g. 'cluster.env.NCCL_DEBUG=\"1\"' (set by the override "
                   "cluster.env.NCCL_DEBUG=1)"), got
    r = mlaunch("validate", write_spec(tmp_path, data), 'cluster.env.NCCL_DEBUG="1"')
    assert r.returncode == 0, r.stdout + r.stderr


def test_max_steps_over_a_spec_with_epochs_says_how_to_drop_them(tmp_path):
    got, = refused(tmp_path, seed000(), "max_steps=10")
    assert got.startswith("mlaunch: training: give exactly one of epochs or max_steps")
    assert "training.epochs=null training.max_steps=N" in got
    r = mlaunch("validate", write_spec(tmp_path, seed000()), "training.epochs=null", "max_steps=10")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_example_for_a_host_listed_twice_fits_gpus_per_node(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)   # seed 000 reads it from the shell
    data = set_path(set_path(seed000(), "cluster.hosts", ["gpu1", "gpu1"]), "cluster.gpus_per_node", 4)
    data["batch"].pop("global", None)   # seed 000's is for its 4 nodes
    line, = problems(data)
    assert line.endswith("give cuda_visible_devices one list per node of gpus_per_node (4) GPUs, e.g. "
                         "[[0, 1, 2, 3], [4, 5, 6, 7]], or list the host once"), line
    job = validate(set_path(data, "cluster.cuda_visible_devices", [[0, 1, 2, 3], [4, 5, 6, 7]]))
    assert len(job.cluster.hosts) == 2
    data["cluster"].pop("cuda_visible_devices")
    line, = problems(set_path(data, "cluster.gpus_per_node", [2, 4]))   # a count per node
    assert line.endswith("one list per node of its gpus_per_node GPUs, e.g. [[0, 1], [2, 3, 4, 5]], "
                         "or list the host once"), line
    data["cluster"].pop("gpus_per_node")   # no count: its own line, and no example (was a traceback)
    assert problems(data)[-1].endswith("give cuda_visible_devices one list per node, or list the host once")


def test_a_secret_written_in_the_spec_or_read_empty_gets_a_note(monkeypatch):
    """Not refused (cluster.env is where secrets live, masked), but said: the job file holds a
    literal one; an empty one read from the shell reaches the nodes empty."""
    monkeypatch.setenv("HF_TOKEN", "")
    job = validate(set_path(seed000(), "cluster.env.WANDB_API_KEY", TOKEN))
    notes = [n for n in job._notes if n.startswith("cluster.env.")]
    assert notes == [
        "cluster.env.HF_TOKEN is empty in this shell: the nodes get it empty",
        "cluster.env.WANDB_API_KEY is written in the spec: mlaunch masks it everywhere it prints or stores "
        "it, but the file holds it; `WANDB_API_KEY: ${WANDB_API_KEY}` reads it from the shell that runs "
        "mlaunch instead"], notes
    assert not any(TOKEN in n for n in job._notes)


def test_plan_and_render_say_each_override_as_validate_does(tmp_path, monkeypatch):
    """docs/commands.md: every override is said as a `note: override ...` line (render's on
    stderr: its stdout lists the files it wrote)."""
    env = {"HF_TOKEN": TOKEN, "MLAUNCH_HOME": str(tmp_path / "home")}
    spec = write_spec(tmp_path, seed000())
    note = "note: override training.learning_rate=0.0002 (the spec says 2.0e-05)"
    r = mlaunch("plan", spec, "training.learning_rate=2e-4", env=env)
    assert r.returncode == 0 and r.stdout.splitlines()[0] == note, r.stdout + r.stderr
    r = mlaunch("render", spec, "--out", str(tmp_path / "out"), "training.learning_rate=2e-4", env=env)
    assert r.returncode == 0 and r.stderr.splitlines()[0] == note, r.stdout + r.stderr
    assert all(os.path.isfile(line) for line in r.stdout.splitlines())


@pytest.mark.parametrize("key, value", [("training.epochs", float("inf")), ("training.learning_rate", float("nan"))])
def test_an_infinite_or_nan_number_is_refused_as_such(key, value, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    line, = problems(set_path(seed000(), key, value))
    assert line == f"{key}: {value} is not a finite number: write a number > 0", line


def _swift(monkeypatch) -> dict:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return copy.deepcopy(load_yaml(os.path.join(CONFIGS, "seed003-qwen2.5-14b-swift-lora.yaml")))


def test_a_template_a_plugin_registers_is_not_held_against_the_list(monkeypatch):
    """ms-swift registers templates from custom_register_path / external_plugins: a name outside
    its own list is taken there; without them it is refused."""
    spec = set_path(_swift(monkeypatch), "template", "my_tmpl")
    assert problems(spec)[0].startswith("template: 'my_tmpl' is not a template of ms-swift 4.6.0")
    spec["passthrough"] = {**(spec.get("passthrough") or {}), "custom_register_path": ["/data/reg.py"]}
    assert validate(spec).template == "my_tmpl"


def test_qlora_under_zero3_stays_refused_for_ms_swift(monkeypatch):
    spec = _swift(monkeypatch)
    spec["finetuning"] = {**spec["finetuning"], "quantization_bit": 4}
    spec["deepspeed"] = {"stage": 3}
    assert any(p.startswith("finetuning.quantization_bit: QLoRA cannot be combined with ZeRO-3 under ms-swift")
               for p in problems(spec)), problems(spec)


def test_no_secret_note_for_a_name_that_only_contains_token(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    job = validate(set_path(seed000(), "cluster.env.TOKENIZERS_PARALLELISM", "false"))
    assert not [n for n in job._notes if "TOKENIZERS_PARALLELISM" in n]

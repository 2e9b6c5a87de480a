"""Bad input found by a probe, through the real CLI: a batch planned for ever, a malformed
override read as a spec file, a newline in an override value, empty paths, an ssh user with a
space. Each is a user error: one line per problem naming the field, no traceback, exit 2."""
from __future__ import annotations

import pytest
import yaml

from .helpers import mlaunch, write_spec

BASE = {
    "name": "qwen-lora",
    "cluster": {"hosts": ["gpu1", "gpu2"], "gpus_per_node": 8, "python": "/opt/conda/bin/python"},
    "trainer": "llamafactory",
    "model": "/mnt/shared/models/Qwen2-7B-Instruct",
    "template": "qwen",
    "dataset": "alpaca_en_demo",
    "dataset_dir": "/mnt/shared/data",
    "finetuning": {"type": "lora"},
    "batch": {"per_device": 2, "grad_accum": 4},
    "precision": "bf16",
    "deepspeed": {"stage": 2},
    "training": {"learning_rate": 1.0e-4, "epochs": 3},
    "output_dir": "/mnt/shared/output/qwen-lora",
}


@pytest.fixture
def base(tmp_path) -> str:
    return write_spec(tmp_path, BASE)


def refused(r, field: str) -> str:
    """r is a user error (exit 2, mlaunch's lines only, no traceback) with exactly one line
    naming field; that line."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    lines = r.stderr.splitlines()
    assert lines and all(line.startswith("mlaunch: ") for line in lines), r.stderr
    named = [line for line in lines if f"mlaunch: {field}" in line]
    assert len(named) == 1, r.stderr
    return named[0]


# ---- 1: batch sizes: bounded, and planning a huge global batch finishes -----------------------

def test_huge_global_batch_with_auto_split_finishes_and_is_refused(base):
    # the hang this was: an O(n) divisor loop; the call's timeout (load-scaled) is the guard
    r = mlaunch("validate", base, "batch.per_device=auto", "batch.grad_accum=auto",
                "batch.global=1000000000000", timeout=60)
    line = refused(r, "batch.global")
    assert "1000000000000 is too large" in line and "2147483647" in line


def test_largest_global_batch_is_planned(base):
    # 2^30 over 16 processes: 2^26 per process, split within the limits (divisors in O(sqrt n))
    r = mlaunch("plan", base, "batch.per_device=auto", "batch.grad_accum=auto",
                "batch.global=1073741824", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "batch: per_device 1024 × grad_accum 65536" in r.stdout


@pytest.mark.parametrize("override,field,limit", [
    ("batch.per_device=100000000000000000000", "batch.per_device", "65536"),
    ("batch.grad_accum=65537", "batch.grad_accum", "65536"),
    ("batch.global=100000000000000000000", "batch.global", "2147483647"),
])
def test_batch_size_over_its_limit_is_one_line(base, override, field, limit):
    line = refused(mlaunch("validate", base, override), field)
    assert override.split("=")[1] + " is too large" in line and limit in line


def test_product_over_the_global_limit_is_refused(base):
    line = refused(mlaunch("validate", base, "batch.per_device=65536", "batch.grad_accum=65536"),
                   "batch.global")
    assert "68719476736" in line and "2147483647" in line


def test_derived_accumulation_over_its_limit_is_refused(base):
    line = refused(mlaunch("validate", base, "batch={per_device: 1, global: 1073741824}"),
                   "batch.grad_accum")
    assert "67108864" in line and "65536" in line


# ---- 2: validate: a malformed override is an override, not a second spec -------------------------

@pytest.mark.parametrize("arg", ["=x", "training.learning_rate", "lr =3"])
def test_validate_names_a_malformed_override_as_plan_does(base, arg):
    want = (f"mlaunch: override {arg!r}: not KEY=VALUE; write a dotted key, e.g. "
            "training.learning_rate=1e-5")
    for cmd in ("validate", "plan"):
        r = mlaunch(cmd, base, arg)
        assert refused(r, f"override {arg!r}") == want, (cmd, r.stderr)
        assert "cannot read the spec" not in r.stderr


def test_validate_still_takes_several_specs_and_a_missing_one_is_a_file(base, tmp_path):
    other = write_spec(tmp_path, BASE, name="other.yaml")
    r = mlaunch("validate", base, other, "training.learning_rate=1e-5")
    assert r.returncode == 0 and r.stdout.count(": ok (") == 2, r.stderr
    r = mlaunch("validate", base, str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "missing.yaml: cannot read the spec" in r.stderr


# ---- 3: a newline in an override value is refused, not folded into a space ------------------------

@pytest.mark.parametrize("value", ["/a\nb", "/a\rb"])
def test_newline_in_override_value_is_refused(base, value):
    line = refused(mlaunch("validate", base, f"model={value}"), "override model")
    assert line == ("mlaunch: override model: the value contains a newline or NUL character; "
                    "use a single-line value")


# ---- 4: empty paths --------------------------------------------------------------------------------

@pytest.mark.parametrize("field", ["model", "output_dir", "dataset_dir", "cluster.python",
                                   "cluster.venv", "cluster.workdir", "deepspeed.config"])
def test_empty_path_is_refused_like_null(base, field):
    override = "deepspeed={config: ''}" if field == "deepspeed.config" else f"{field}=''"
    line = refused(mlaunch("validate", base, override), field)
    assert f"{field}: '' is empty; write " in line


def test_blank_path_in_the_spec_file_is_refused_too(tmp_path):
    r = mlaunch("validate", write_spec(tmp_path, {**BASE, "output_dir": "  "}))
    assert refused(r, "output_dir").startswith("mlaunch: output_dir: '  ' is empty; write `output_dir: ")


# ---- 5: cluster.ssh.user follows the user@host rule ------------------------------------------------

@pytest.mark.parametrize("user", ["ro ot", "-oProxyCommand=x", "a@b"])
def test_ssh_user_that_cannot_be_a_login_is_refused(base, user):
    line = refused(mlaunch("validate", base, f"cluster.ssh.user={user}"), "cluster.ssh.user")
    assert f"{user!r} is not a user name" in line


def test_ordinary_ssh_user_is_accepted(base):
    r = mlaunch("validate", base, "cluster.ssh.user=train.bot-1")
    assert r.returncode == 0, r.stderr


# ---- 6: each YAML error says what to do at its line and column -------------------------------------

@pytest.mark.parametrize("tail,fix", [
    ("---\nname: other\n", "one document per spec: remove the second `---`"),
    ("template: !!python/object:os.system x\n", "tags (!!python/..., !name) are not accepted: write a plain value"),
    ("dataset: [a\n", "fix the YAML at that line and column (check indentation and quoting)"),
])
def test_yaml_error_line_has_a_fix(tmp_path, tail, fix):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({k: v for k, v in BASE.items() if k != "template"},
                                   sort_keys=False) + tail)
    line = refused(mlaunch("validate", str(spec)), f"{spec}:")
    assert "YAML syntax" in line and fix in line, line


# ---- 7: a deepspeed.config that is not JSON: where, and the fix ------------------------------------

def test_deepspeed_config_not_json_says_where_and_the_fix(tmp_path):
    bad = tmp_path / "bad_ds.json"
    bad.write_text('{"train_batch_size": 16,\n "zero_optimization": {"stage": 2,, }}\n')
    spec = write_spec(tmp_path, {**BASE, "deepspeed": {"config": str(bad)}})
    line = refused(mlaunch("validate", spec), "deepspeed.config")
    assert f"{bad} is not JSON: Expecting property name" in line
    assert "at line 2, column 35; fix it there (keys and strings in double quotes" in line, line


# ---- 8: an invalid cluster.env name says what a valid one is ---------------------------------------

def test_invalid_env_name_says_what_a_name_is(base):
    line = refused(mlaunch("validate", base, "cluster.env={1BAD: x}"), "cluster.env.1BAD")
    assert "not a valid environment variable name: use letters, digits and _, not starting with a " \
           "digit" in line, line


# ---- 9: nvme offload without nvme_path: what to write ----------------------------------------------

def test_nvme_offload_without_path_gives_an_example(base):
    line = refused(mlaunch("validate", base, "deepspeed={stage: 3, offload_param: nvme}"),
                   "deepspeed.nvme_path")
    assert "`nvme_path: /local_nvme`" in line and "offload to cpu" in line, line


# ---- 10: an unset ${VAR} set by an override says what is wrong, as in the spec file ----------------

def test_unset_env_ref_through_an_override_says_it_is_not_set(base, tmp_path):
    r = mlaunch("validate", base, "cluster.env.X=${MLAUNCH_TEST_UNSET_ZZZ}")
    line = refused(r, "cluster.env.X")
    assert "${MLAUNCH_TEST_UNSET_ZZZ} is not set in this shell: export MLAUNCH_TEST_UNSET_ZZZ=" in line
    assert "(set by the override" in line
    in_file = write_spec(tmp_path, {**BASE, "cluster": {**BASE["cluster"],
                                                        "env": {"X": "${MLAUNCH_TEST_UNSET_ZZZ}"}}},
                         name="in_file.yaml")
    assert "is not set in this shell: export" in refused(mlaunch("validate", in_file), "cluster.env.X")


# ---- 11: a spec path with a newline stays on one line ----------------------------------------------

def test_spec_path_with_a_newline_is_shown_escaped(tmp_path):
    spec = write_spec(tmp_path, {**BASE, "precision": "bf61"}, name="new\nline.yaml")
    r = mlaunch("validate", spec)
    shown = repr(spec)
    assert refused(r, shown) == f"mlaunch: {shown}: invalid job spec"
    assert refused(r, "precision").startswith("mlaunch: precision: 'bf61' is not one of")
    missing = str(tmp_path / "no\nfile.yaml")
    assert "cannot read the spec" in refused(mlaunch("validate", missing), repr(missing))


# ---- 12: a key of another trainer's spec names the trainer, not a near miss ------------------------

def test_other_trainers_key_names_the_trainer(base):
    line = refused(mlaunch("validate", base, "trainer=swift"), "dataset_dir")
    assert line == ("mlaunch: dataset_dir: unknown key for trainer swift (it is LLaMA-Factory's); "
                    "remove it or set `trainer: llamafactory`")
    line = refused(mlaunch("validate", base, "rlhf_type=dpo"), "rlhf_type")
    assert "unknown key for trainer llamafactory (it is ms-swift's); remove it or set `trainer: swift`" in line


# ---- LLaMA-Factory checkpoints without optimizer state cannot be resumed ----------------------

def test_llamafactory_save_only_model_refuses_restarts_and_resume(tmp_path):
    """The Trainer's save_only_model writes weights and trainer_state.json only: a resume would
    go on at the saved step with a fresh optimizer and the LR schedule restarted. Refused, as
    for ms-swift, where a restart or --resume would need it."""
    spec = write_spec(tmp_path, {**BASE, "passthrough": {"save_only_model": True}})
    line = refused(mlaunch("validate", spec, "max_restarts=2"), "max_restarts")
    assert "save_only_model" in line and "max_restarts: 0" in line
    r = mlaunch("submit", spec, "--resume", "--dry-run")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "--resume: nothing can be resumed" in r.stderr and "save_only_model" in r.stderr
    assert mlaunch("validate", spec).returncode == 0   # without restarts or a resume: its choice

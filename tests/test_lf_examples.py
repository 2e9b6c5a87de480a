"""Acceptance corpus: LLaMA-Factory v0.9.5's own SFT, pretraining, DPO, KTO and reward-model
examples, each re-expressed as an mlaunch spec in configs/lf-examples/.

Every spec is rendered (for 1 node x 2 ranks) and parsed by LLaMA-Factory's own get_train_args
under torchrun with one rank (gloo: a torchrun process is distributed whatever its world, which
the DeepSpeed examples need; a second rank parsed the same arguments again: 38 -> 17 s of CPU),
beside the example's keys (tests/lf_examples.py) parsed the same way. The effective arguments
must be equal except for the keys mlaunch owns, each listed with its reason in
configs/lf-examples/DIFFERENCES.md. Ray examples are refused with one line.
"""
from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import yaml

from launcher.errors import SpecError
from launcher.plan.launch_plan import build_plan
from launcher.spec import validate

from .loadfactor import limit
from .helpers import CONFIGS, ROOT, free_port, load_yaml
from .lf_examples import OWN, REFUSED, example
from .training import require_trainer

pytestmark = pytest.mark.training

CORPUS = os.path.join(CONFIGS, "lf-examples")
# Effective arguments that differ by design: "group.key" -> the reason (DIFFERENCES.md says it too).
OWNED = {
    "training.overwrite_output_dir": "mlaunch guards output_dir: false unless submit --overwrite",
    "training.deepspeed": "the path of mlaunch's rendered ds_config.json",
    "training.logging_dir": "transformers stamps it with the parse time (runs/<time>_<host>)",
}
STAGE_OF_DS = {"ds_z0": (0, "none", "none"), "ds_z2": (2, "none", "none"), "ds_z2_offload": (2, "cpu", "none"),
               "ds_z3": (3, "none", "none"), "ds_z3_offload": (3, "cpu", "cpu"), "ds_z3_fp8": (3, "cpu", "none")}


def auto_ds_config(name: str) -> dict:
    """What an example's DeepSpeed config asks for: its stage and offload, every number "auto"."""
    stage, opt, param = STAGE_OF_DS[name]
    zero: dict = {"stage": stage}
    if opt != "none":
        zero["offload_optimizer"] = {"device": opt}
    if param != "none":
        zero["offload_param"] = {"device": param}
    return {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
            "zero_allow_untested_optimizer": True, "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
            "zero_optimization": zero}


def corpus_names() -> list[str]:
    return sorted(os.path.basename(p)[:-5] for p in os.listdir(CORPUS) if p.endswith(".yaml"))


def test_corpus_covers_every_recorded_example():
    assert sorted(set(OWN) | set(REFUSED)) == corpus_names()


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_ray_example_is_refused_with_one_line(name):
    with pytest.raises(SpecError) as err:
        validate(load_yaml(os.path.join(CORPUS, f"{name}.yaml")))
    lines = [str(p) for p in err.value.problems]
    assert len(lines) == 1 and lines[0].startswith(REFUSED[name]), lines


def test_differences_table_lists_every_owned_key():
    table = open(os.path.join(CORPUS, "DIFFERENCES.md"), encoding="utf-8").read()
    for key in OWNED:
        assert f"`{key.split('.', 1)[1]}`" in table, key


def render_pair(name: str, base: str) -> dict:
    """Render the spec for 1 node x 2 ranks; write the files and the example's ds config."""
    spec = load_yaml(os.path.join(CORPUS, f"{name}.yaml"))
    work = os.path.join(base, name)
    spec["cluster"] = {"hosts": ["localhost"], "gpus_per_node": 2, "workdir": work}
    plan = build_plan(validate(spec), run_id=f"lf-{name}", transformers="4.57.6")
    for f in plan.files:
        os.makedirs(os.path.dirname(f.path), exist_ok=True)
        with open(f.path, "w", encoding="utf-8") as fh:
            fh.write(f.content)
    ex = example(name)
    if "deepspeed" in ex:
        path = os.path.join(work, ex["deepspeed"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            json.dump(auto_ds_config(os.path.basename(path)[:-len("_config.json")]), fh)
    rendered = next(f.path for f in plan.files if f.path.endswith("llamafactory.yaml"))
    return {"name": name, "cwd": work, "example": ex, "mlaunch": rendered}


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    python = require_trainer()
    base = str(tmp_path_factory.mktemp("corpus"))
    # Plain runs first: a DeepSpeed parse leaves accelerate state behind in the process.
    names = sorted(OWN, key=lambda n: ("deepspeed" in example(n), n))
    pairs = [render_pair(n, base) for n in names]
    with open(os.path.join(base, "pairs.json"), "w") as fh:
        json.dump(pairs, fh)
    out = os.path.join(base, "parsed.json")
    torchrun = os.path.join(os.path.dirname(python), "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo",
           "LLAMAFACTORY_VERBOSITY": "WARN"}
    r = subprocess.run([torchrun, "--nproc-per-node", "1", "--master-port", str(free_port()),
                        os.path.join(ROOT, "tests", "scripts", "lf_parse_pairs.py"),
                        os.path.join(base, "pairs.json"), out],
                       capture_output=True, text=True, env=env, timeout=limit(900))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return json.load(open(out))


@pytest.mark.parametrize("name", sorted(OWN))
def test_example_and_spec_parse_to_the_same_arguments(parsed, name):
    got = parsed[name]
    assert "error" not in got["example"], got["example"]
    assert "error" not in got["mlaunch"], got["mlaunch"]
    ex, ml = got["example"], got["mlaunch"]
    differ = sorted(k for k in set(ex) | set(ml) if ex.get(k) != ml.get(k))
    assert not [k for k in differ if k not in OWNED], {k: (ex.get(k), ml.get(k)) for k in differ}
    assert ex["training.overwrite_output_dir"] is True and ml["training.overwrite_output_dir"] is False
    if "deepspeed" in example(name):
        assert re.search(r"/\.mlaunch/([\w.-]+/)?lf-[\w-]+/ds_config\.json$", ml["training.deepspeed"])


def test_fsdp_section_parses_as_the_trainers_fsdp_arguments(tmp_path):
    """FSDP at the parser level: accelerate builds its FSDP plugin only on an accelerator, so
    no CPU run. The rendered keys must mean to LLaMA-Factory's parser what a user's own do."""
    python = require_trainer()
    spec = load_yaml(os.path.join(CORPUS, "qwen3_lora_sft.yaml"))
    spec["cluster"] = {"hosts": ["localhost"], "gpus_per_node": 2, "workdir": str(tmp_path)}
    spec["fsdp"] = {"sharding": "full_shard", "offload": True, "layer_cls": ["Qwen3DecoderLayer"]}
    plan = build_plan(validate(spec), run_id="lf-fsdp", transformers="4.57.6")
    (f,) = plan.files
    os.makedirs(os.path.dirname(f.path))
    open(f.path, "w").write(f.content)
    by_hand = {**example("qwen3_lora_sft"), "fsdp": "full_shard auto_wrap offload",
               "fsdp_config": {"transformer_layer_cls_to_wrap": ["Qwen3DecoderLayer"], "use_orig_params": True}}
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps([{"name": "fsdp", "cwd": str(tmp_path), "example": by_hand, "mlaunch": f.path}]))
    torchrun = os.path.join(os.path.dirname(python), "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "LLAMAFACTORY_VERBOSITY": "WARN"}
    r = subprocess.run([torchrun, "--nproc-per-node", "1", "--master-port", str(free_port()),
                        os.path.join(ROOT, "tests", "scripts", "lf_parse_pairs.py"), str(pairs),
                        str(tmp_path / "out.json")], capture_output=True, text=True, env=env, timeout=limit(600))
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.load(open(tmp_path / "out.json"))["fsdp"]
    ex, ml = got["example"], got["mlaunch"]
    assert "error" not in ml, ml
    assert ml["training.fsdp"] == ["full_shard", "auto_wrap", "offload"]
    assert ml["training.fsdp_config"]["transformer_layer_cls_to_wrap"] == ["Qwen3DecoderLayer"]
    assert ml["training.fsdp_config"]["use_orig_params"] is True
    differ = sorted(k for k in set(ex) | set(ml) if ex.get(k) != ml.get(k))
    assert not [k for k in differ if k not in OWNED], {k: (ex.get(k), ml.get(k)) for k in differ}

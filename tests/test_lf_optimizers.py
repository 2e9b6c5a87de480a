"""LLaMA-Factory's own optimizers and transformers' `optim` choices: real runs, and refusals.

mlaunch's ds_config states no optimizer block, so the Trainer (LLaMA-Factory's
create_custom_optimizer, or transformers' `optim`) builds the optimizer and DeepSpeed wraps
it (transformers sets zero_allow_untested_optimizer itself). Each run proves that the asked
optimizer is the one that stepped: the class the Trainer built (mlaunch's rank-0 line, under
DeepSpeed) and the optimizer's own state read back from the checkpoint (8-bit state buffers,
Adam-mini's per-block `vmean`, Adafactor's `RMS`, Muon's momentum) or, for BAdam, which
weights changed; never only "it trained". Adam-mini and Muon run under DDP: under ZeRO they
stop at the first step, and are refused (the refusal tests at the end).
"""
from __future__ import annotations

import glob
import json
import os
import subprocess

import pytest

from .loadfactor import limit
from .test_training import assert_trained
from .training import (OPTIONAL_PATH, TRAINER_PYTHON, TRAINER_VENV, build_tiny, lf_spec, require_trainer,
                       submit_timed)

pytestmark = [pytest.mark.training]

FULL = {"type": "full"}

# Summarises a saved optimizer state_dict: each group's settings (not its params) and, for
# the state, each key with its dtypes (tensors) or values (numbers, strings).
_SUMMARY = r"""
import json, sys, torch
sd = torch.load(sys.argv[1], map_location="cpu", weights_only=False)
if "optimizer_state_dict" in sd:            # a ZeRO shard: DeepSpeed's wrapper, then the base
    sd = sd["optimizer_state_dict"]
    sd = sd.get("base_optimizer_state", sd.get("optimizer_state_dict", sd))
elif "optimizer" in sd:                     # ZeRO-0: the optimizer is in the model states
    sd = sd["optimizer"]
plain = lambda v: v if isinstance(v, (int, float, str, bool, type(None))) else (
    list(v) if isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) for x in v) else None)
groups = [{k: plain(v) for k, v in g.items() if k != "params" and plain(v) is not None}
          for g in sd["param_groups"]]
keys = {}
def note(k, v):
    if isinstance(v, dict):                 # bitsandbytes packs its quantized state in a dict
        for sub, w in v.items():
            note(f"{k}.{sub}", w)
    else:
        keys.setdefault(k, set()).add(str(v.dtype) if torch.is_tensor(v) else repr(v)[:40])
for st in sd["state"].values():
    for k, v in st.items():
        note(k, v)
print(json.dumps({"groups": groups, "state": {k: sorted(v) for k, v in keys.items()},
                  "tensors": len(sd["state"])}))
"""


OPTIMIZER_PACKAGES = ("badam", "adam_mini", "bitsandbytes")   # tests/env/trainer-requirements.txt


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    python = require_trainer()
    code = "import importlib.util, sys; print([m for m in sys.argv[1:] if not importlib.util.find_spec(m)])"
    r = subprocess.run([python, "-c", code, *OPTIMIZER_PACKAGES], capture_output=True, text=True,
                       timeout=limit(120), env={**os.environ, "PYTHONPATH": OPTIONAL_PATH})
    missing = r.stdout.strip()
    if missing != "[]":
        pytest.skip(f"the trainer venv {TRAINER_VENV} lacks {missing} (an older build): run "
                    f"`bash tests/env/make_trainer_venv.sh {TRAINER_VENV}`")
    return build_tiny(str(tmp_path_factory.mktemp("tiny")))


def saved_optimizer(ckpt: str) -> dict:
    """The optimizer state of rank 0 in a checkpoint (ZeRO shard, DDP's optimizer.pt, or
    ZeRO-0's model states)."""
    found = (glob.glob(os.path.join(ckpt, "global_step*", "*zero_pp_rank_0_mp_rank_00_optim_states.pt"))
             or glob.glob(os.path.join(ckpt, "optimizer.pt"))
             or glob.glob(os.path.join(ckpt, "global_step*", "mp_rank_00_model_states.pt")))
    assert len(found) == 1, os.listdir(ckpt)
    r = subprocess.run([TRAINER_PYTHON, "-c", _SUMMARY, found[0]], capture_output=True, text=True,
                       timeout=limit(300), env={**os.environ, "PYTHONPATH": OPTIONAL_PATH})
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_local(tmp_path, tiny, procs: int = 2, **kw):
    """One node, 2 processes by default (the optimizer path does not depend on the node count)."""
    out = str(tmp_path / "out")
    r = submit_timed(tmp_path, with_optional(lf_spec(tiny, ["localhost"], procs, out, **kw)))
    return r, out


def run_hosts(make_hostset, tmp_path, tiny, **kw):
    """2 namespace hosts x 1 process."""
    out = str(tmp_path / "out")
    with make_hostset(2) as hs:
        r = submit_timed(tmp_path, with_optional(lf_spec(tiny, [h.ip for h in hs.hosts], 1, out, hs=hs, **kw)))
    return r, out


def with_optional(spec: dict) -> dict:
    """spec whose ranks also find the trainer venv's optional packages where its optimizer is
    one of bitsandbytes' (the others' runs leave it out: peft imports it for every LoRA layer)."""
    if "8bit" in str((spec.get("passthrough") or {}).get("optim", "")):
        spec["cluster"]["env"]["PYTHONPATH"] = OPTIONAL_PATH
    return spec


def optimizer_class(r) -> str:
    """The optimizer class the Trainer built, from mlaunch's rank-0 line (the entry script)."""
    line = next(ln for ln in r.stdout.splitlines() if "mlaunch: optimizer " in ln)
    return line.split("mlaunch: optimizer ", 1)[1].split(":", 1)[0]


UNTESTED = "You are using ZeRO with an untested optimizer"


def adam_8bit(saved: dict) -> bool:
    """bitsandbytes' 8-bit state: both moments stored as uint8 (groups above its 4096-element
    minimum; smaller ones stay 32-bit)."""
    st = saved["state"]
    return all("torch.uint8" in st.get(f"__bnb_optimizer_quant_state__.state{i}", []) for i in (1, 2))


# optim -> (the class the Trainer builds, what only that optimizer's saved state has: the
# class name alone does not tell torch's AdamW from bitsandbytes' or a fused one)
OPTIM = {
    "adamw_torch_fused": ("AdamW",
                          lambda s: all(g.get("fused") is True for g in s["groups"])),
    "adafactor": ("Adafactor",
                  lambda s: "RMS" in s["state"] and "exp_avg_sq" in s["state"]
                  and all(g.get("relative_step") is False for g in s["groups"])),
    "sgd": ("SGD",
            lambda s: "exp_avg" not in s["state"] and all("dampening" in g for g in s["groups"])),
    "adamw_8bit": ("AdamW", adam_8bit),
}
# paged_adamw_8bit is validated (lf_optim_rules.py) but not run here: on CPU bitsandbytes
# pages nothing and builds adamw_8bit's optimizer, so its run proved nothing adamw_8bit's
# does not (and cost a trainer run).


@pytest.mark.parametrize("optim,stage", [(o, 2) for o in OPTIM] + [("adafactor", 3), ("adamw_8bit", 3)])
def test_optim_choice_runs_under_zero(tmp_path, tiny, optim, stage):
    """Full fine-tuning (the flat ZeRO partitions are large enough for 8-bit state), one
    process: DeepSpeed wraps and steps the Trainer's optimizer the same way at any world size,
    and one rank halves the trainer start-up CPU of these seven runs."""
    r, out = run_local(tmp_path, tiny, 1, deepspeed={"stage": stage}, finetuning=FULL, max_steps=4,
                       save_steps=4, passthrough={"optim": optim})
    assert_trained(r, out, 4)
    cls, has_own_state = OPTIM[optim]
    assert optimizer_class(r) == cls
    saved = saved_optimizer(os.path.join(out, "checkpoint-4"))
    assert has_own_state(saved), saved
    # DeepSpeed accepts a class outside its tested list (torch's Adam/AdamW/Adagrad, its own)
    # because transformers sets zero_allow_untested_optimizer; it says so on rank 0.
    assert (UNTESTED in r.stdout) == (optim != "adamw_torch_fused")


_CHANGED = r"""
import json, sys
from safetensors.torch import load_file
base, new = load_file(sys.argv[1]), load_file(sys.argv[2])
print(json.dumps(sorted(k for k in base if k in new and not base[k].equal(new[k]))))
"""


def changed_tensors(base_model: str, out: str) -> list[str]:
    """Names of the weights that training changed (the saved model against the base)."""
    r = subprocess.run([TRAINER_PYTHON, "-c", _CHANGED, os.path.join(base_model, "model.safetensors"),
                        os.path.join(out, "model.safetensors")], capture_output=True, text=True, timeout=limit(300))
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.multihost
def test_badam_layer_mode_zero3_trains_one_block(make_hostset, tmp_path, tiny):
    """Layer-wise BAdam (LLaMA-Factory allows it distributed only under ZeRO-3): with no block
    switch in 4 steps, exactly the start block (model.layers.1) changes; AdamW would change all."""
    r, out = run_hosts(make_hostset, tmp_path, tiny, deepspeed={"stage": 3}, finetuning=FULL,
                       max_steps=4, save_steps=4,
                       passthrough={"use_badam": True, "badam_mode": "layer", "badam_start_block": 1,
                                    "badam_switch_mode": "ascending", "badam_switch_interval": 50})
    assert_trained(r, out, 4)
    assert "Using BAdam optimizer with layer-wise update, switch mode is ascending" in r.stdout
    assert optimizer_class(r) == "BlockOptimizer" and UNTESTED in r.stdout
    changed = changed_tensors(tiny["model"], out)
    assert changed and {n.split(".")[2] for n in changed} == {"1"}, changed
    assert "model.layers.1.self_attn.q_proj.weight" in changed, changed


# Without ZeRO: DDP, and DeepSpeed's stage 0 (it keeps the weights whole). Each optimizer runs
# under one of them and each engine carries one optimizer: a run of every pair cost 40 s more
# of the suite's CPU for the same two code paths (the optimizer's, the engine's wrapping).


@pytest.mark.parametrize("deepspeed", [{"stage": 0}], ids=["zero0"])
def test_adam_mini_runs_without_zero(tmp_path, tiny, deepspeed):
    """Adam-mini on 2 processes (under ZeRO-1/2/3 it stops: refused, see below): one second
    moment per block (`vmean`) instead of one per weight, groups named per weight."""
    r, out = run_local(tmp_path, tiny, finetuning=FULL, max_steps=4, save_steps=4, deepspeed=deepspeed,
                       passthrough={"use_adam_mini": True})
    assert_trained(r, out, 4)
    assert "Using Adam-mini optimizer." in r.stdout
    assert deepspeed is None or optimizer_class(r) == "Adam_mini"
    saved = saved_optimizer(os.path.join(out, "checkpoint-4"))
    st = saved["state"]   # per-block second moments of query/key heads and neurons, no AdamW keys
    assert {"vmean", "head_per_gpu", "neuron_per_gpu"} <= set(st) and "exp_avg_sq" not in st, saved
    names = [g.get("name") for g in saved["groups"]]
    assert "model.layers.0.self_attn.q_proj.weight" in names, names


@pytest.mark.parametrize("deepspeed", [None], ids=["ddp"])
def test_muon_runs_without_zero(tmp_path, tiny, deepspeed):
    """Muon (bundled with LLaMA-Factory) on 2 processes: the 2-D weights get Muon's momentum,
    the rest (embedding, norms, biases) its inner AdamW."""
    r, out = run_local(tmp_path, tiny, finetuning=FULL, max_steps=4, save_steps=4, deepspeed=deepspeed,
                       passthrough={"use_muon": True})
    assert_trained(r, out, 4)
    assert "Using Muon optimizer with 14 Muon params and 12 AdamW params." in r.stdout
    assert deepspeed is None or optimizer_class(r) == "Muon"
    saved = saved_optimizer(os.path.join(out, "checkpoint-4"))
    assert saved["tensors"] == 26, saved
    assert saved["state"]["use_muon"] == ["False", "True"], saved
    assert "momentum_buffer" in saved["state"] and "moment1" in saved["state"], saved


# --- refusals at validate time (seed 000: 4 nodes x 4 GPUs, LoRA, ZeRO-2) -------------------

def _spec(**changes) -> dict:
    from .test_lf_spec import spec
    return spec(**changes)


ZERO3 = {"stage": 3}
OFFLOAD = {"stage": 2, "offload_optimizer": "cpu"}
OPTIM_REFUSALS = [
    (dict(finetuning=FULL, deepspeed=None, passthrough={"use_adam_mini": True, "use_muon": True}),
     "passthrough.use_muon: LLaMA-Factory builds one optimizer and takes Adam-mini (use_adam_mini) "
     "first, so Muon would be ignored; keep one of use_adam_mini, use_muon"),
    (dict(passthrough={"loraplus_lr_ratio": 16.0, "use_adam_mini": True}),
     "passthrough.use_adam_mini: LLaMA-Factory builds one optimizer and takes LoRA+ (loraplus_lr_ratio) "
     "first, so Adam-mini would be ignored"),
    (dict(deepspeed=ZERO3, passthrough={"use_badam": True}),
     "passthrough.use_badam: LLaMA-Factory cannot use BAdam with finetuning.type lora (it trains the "
     "full parameters block by block / by projection); use type full or freeze, or remove it"),
    (dict(finetuning=FULL, passthrough={"use_muon": True}),
     "passthrough.use_muon: LLaMA-Factory's Muon cannot run under DeepSpeed ZeRO-2: it orthogonalises "
     "whole 2-D weights and ZeRO gives it flat shards (every rank stops at the first step with "
     "KeyError: 'use_muon'); remove the deepspeed section (plain DDP)"),
    (dict(finetuning=FULL, deepspeed=ZERO3, passthrough={"use_muon": True}),
     "passthrough.use_muon: LLaMA-Factory's Muon cannot run under DeepSpeed ZeRO-3"),
    (dict(finetuning=FULL, deepspeed=ZERO3, passthrough={"use_adam_mini": True}),
     "passthrough.use_adam_mini: Adam-mini 1.1 cannot run under DeepSpeed ZeRO-3: it splits each 2-D "
     "weight into heads and neurons and ZeRO gives it flat shards (every rank stops at the first step "
     "with IndexError: too many indices for tensor of dimension 1); remove the deepspeed section"),
    (dict(finetuning=FULL, deepspeed={"stage": 1}, passthrough={"use_adam_mini": True}),
     "passthrough.use_adam_mini: Adam-mini 1.1 cannot run under DeepSpeed ZeRO-1"),
    (dict(finetuning=FULL, deepspeed=None, passthrough={"use_muon": True, "optim": "sgd"}),
     "passthrough.optim: sgd is ignored: Muon (use_muon) builds its own optimizer; remove optim"),
    (dict(finetuning=FULL, deepspeed=None, passthrough={"use_adam_mini": True, "optim": "adafactor"}),
     "passthrough.optim: adafactor is ignored: Adam-mini (use_adam_mini) builds its own optimizer"),
    (dict(finetuning=FULL, deepspeed=None, passthrough={"use_galore": True, "optim": "sgd"}),
     "passthrough.optim: sgd cannot be the base of LLaMA-Factory's GaLore (it accepts adamw_torch, "
     "adamw_bnb_8bit, adamw_8bit, paged_adamw_8bit, adafactor); use one of those"),
    (dict(finetuning=FULL, passthrough={"optim": "galore_adamw", "optim_target_modules": ["attn"]}),
     "passthrough.optim: galore_adamw: GaLore does not work with DeepSpeed (it projects 2-D gradients; "
     "ZeRO hands it flat shards); remove the deepspeed section"),
    (dict(finetuning=FULL, deepspeed=None,
          passthrough={"optim": "apollo_adamw_layerwise", "optim_target_modules": ["attn"]}),
     "passthrough.optim: apollo_adamw_layerwise: transformers refuses layer-wise APOLLO in distributed "
     "runs (16 processes); use apollo_adamw"),
    (dict(finetuning=FULL, deepspeed=None, passthrough={"optim": "galore_adamw"}),
     "passthrough.optim: galore_adamw needs passthrough.optim_target_modules"),
    (dict(finetuning=FULL, deepspeed={"stage": 3, "offload_optimizer": "cpu"},
          passthrough={"use_badam": True}),
     "deepspeed.offload_optimizer: offloading the optimizer replaces the one passthrough.use_badam (BAdam) "
     "asks for with DeepSpeed's CPUAdam (accelerate does so unless zero_force_ds_cpu_optimizer is false); "
     "remove offload_optimizer, or use a ds_config file with \"zero_force_ds_cpu_optimizer\": false"),
    (dict(deepspeed=OFFLOAD, passthrough={"optim": "adamw_8bit"}),
     "deepspeed.offload_optimizer: offloading the optimizer replaces the one passthrough.optim adamw_8bit "
     "asks for with DeepSpeed's CPUAdam"),
]


@pytest.mark.parametrize("changes,expected", OPTIM_REFUSALS,
                         ids=[f"{e.split(':')[0]}-{i}" for i, (_, e) in enumerate(OPTIM_REFUSALS)])
def test_optimizer_refusal_is_one_line(changes, expected):
    from .test_lf_spec import problems
    lines = problems(_spec(**changes))
    assert len([ln for ln in lines if ln.startswith(expected)]) == 1, lines


def test_user_file_offload_refused_unless_it_frees_the_optimizer(tmp_path):
    from launcher.spec import validate
    from .test_lf_spec import problems
    zero = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    forced, free = tmp_path / "forced.json", tmp_path / "free.json"
    forced.write_text(json.dumps({"zero_optimization": zero}))
    free.write_text(json.dumps({"zero_optimization": zero, "zero_force_ds_cpu_optimizer": False}))
    pt = {"passthrough": {"optim": "sgd"}}
    lines = problems(_spec(deepspeed={"config": str(forced)}, **pt))
    assert [ln for ln in lines if ln.startswith("deepspeed.config: offloading the optimizer replaces the "
                                                "one passthrough.optim sgd asks for")], lines
    validate(_spec(deepspeed={"config": str(free)}, **pt))


@pytest.mark.parametrize("changes", [
    dict(finetuning=FULL, deepspeed=ZERO3, passthrough={"use_badam": True}),
    dict(finetuning=FULL, deepspeed=None, passthrough={"use_adam_mini": True}),
    dict(finetuning=FULL, deepspeed={"stage": 0}, passthrough={"use_adam_mini": True}),
    dict(finetuning=FULL, deepspeed=None, passthrough={"use_muon": True}),
    dict(finetuning=FULL, deepspeed={"stage": 0}, passthrough={"use_muon": True}),
    dict(passthrough={"loraplus_lr_ratio": 16.0, "optim": "adamw_8bit"}),
    dict(deepspeed=OFFLOAD, passthrough={"loraplus_lr_ratio": 16.0}),
    dict(deepspeed=OFFLOAD, passthrough={"optim": "adamw_torch_fused"}),
    dict(passthrough={"optim": "paged_adamw_8bit"}),
])
def test_supported_optimizers_validate(changes):
    from launcher.spec import validate
    job = validate(_spec(**changes))
    assert {k: job.passthrough[k] for k in changes["passthrough"]} == changes["passthrough"]


def test_badam_accepts_zero3_from_a_user_file(tmp_path):
    """LLaMA-Factory's ZeRO-3 rule for BAdam reads the stage of the user's file too."""
    from launcher.spec import validate
    from .test_lf_spec import problems
    files = {}
    for stage in (2, 3):
        files[stage] = tmp_path / f"z{stage}.json"
        files[stage].write_text(json.dumps({"zero_optimization": {"stage": stage}}))
    pt = {"finetuning": FULL, "passthrough": {"use_badam": True}}
    validate(_spec(deepspeed={"config": str(files[3])}, **pt))
    assert "passthrough.use_badam: layer-wise BAdam runs distributed only under ZeRO-3; set deepspeed: " \
        "{stage: 3}" in problems(_spec(deepspeed={"config": str(files[2])}, **pt))

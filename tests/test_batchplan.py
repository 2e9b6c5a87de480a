"""Batch planning: the automatic choice, explicit settings kept, the refusals, the CLI."""
from __future__ import annotations

import itertools
import json
import os
import posixpath
import re

import pytest

from launcher.plan import batch as batchplan, memory
from launcher.view import memview
from launcher.plan.batch import MemoryInputs, resolve
from launcher.plan.launch_plan import build_plan
from launcher.spec import validate

from .helpers import mlaunch, preflight, seed000, write_spec
from .test_memory import LLAMA_7, QWEN_039, QWEN_15

MODELS = {"0.39b": QWEN_039, "1.5b-150k": QWEN_15, "7b": LLAMA_7}


def job(nodes=1, gpus=1, batch=None, training=None, ft=None, ds=None, cutoff=1024, **cluster):
    d = seed000()
    d["cluster"]["hosts"] = [f"10.1.0.{i + 1}" for i in range(nodes)]
    d["cluster"]["master_addr"] = "10.1.0.1"
    d["cluster"]["gpus_per_node"] = gpus
    d["cluster"].update(cluster)
    d["batch"] = batch if batch is not None else {"global": 64}
    d["training"] = {k: v for k, v in d["training"].items() if k != "gradient_checkpointing"}
    d["training"].update(training or {})
    d["finetuning"] = ft or {"type": "lora", "lora_rank": 16, "lora_target": "all"}
    d["cutoff_len"] = cutoff
    d.pop("deepspeed", None)
    if ds:
        d["deepspeed"] = ds
    return d


def inputs(model="0.39b", gib=140.4):
    return MemoryInputs(gpu_gib=gib, gpu_source="test", model_config=MODELS[model], config_source="test")


def fits(j, model, micro, ckpt, budget):
    shape = memory.shape_from_config(MODELS[model])
    return memory.estimate(shape, batchplan.setting(j, shape, micro, ckpt)).total <= budget


def gib(model, micro, ckpt, **kw) -> float:
    """The estimate of a LoRA job of this file's shape, in GiB (what the refusal lines print)."""
    j = validate(job(**kw))
    shape = memory.shape_from_config(MODELS[model])
    return memory.estimate(shape, batchplan.setting(j, shape, micro, ckpt)).total / memory.GIB


def unfit_64_line() -> str:
    """The refusal of per_device 64 without checkpointing on a 100 GiB GPU, numbers from the estimate."""
    usable = 90.0 * memory.GIB
    j = validate(job())
    shape = memory.shape_from_config(QWEN_039)
    ok = next(m for m in (32, 16, 8, 4, 2, 1)
              if memory.estimate(shape, batchplan.setting(j, shape, m, False)).total <= usable)
    assert gib("0.39b", 64, True) * memory.GIB <= usable < gib("0.39b", 64, False) * memory.GIB
    return (f"batch: estimated {gib('0.39b', 64, False):.1f} GiB per GPU of 100.0 (90.0 usable) with "
            f"per_device 64, gradient checkpointing off: set training.gradient_checkpointing: true, or "
            f"per_device {ok} with grad_accum {64 // ok} (or --force-unfit)")


GRID = list(itertools.product(MODELS, [1, 2, 8, 16], [24, 80, 140.4], ["lora", "full-z3", "full-z2"]))


@pytest.mark.parametrize("model,world,gib,method", GRID, ids=["-".join(map(str, g)) for g in GRID])
def test_choice_fits_divides_and_is_the_preferred_one(model, world, gib, method):
    """Over models × world sizes × GPU memory × methods: the chosen setting divides the global
    batch, fits by the estimate, and no other fitting setting is faster by the speed model
    (so checkpointing is on only when off cannot fit a micro-batch as fast)."""
    ft = {"type": "lora", "lora_rank": 16, "lora_target": "all"} if method == "lora" else {"type": "full"}
    ds = {"stage": int(method[-1])} if method != "lora" else None
    nodes, gpus = (1, world) if world <= 8 else (world // 8, 8)
    j = validate(job(nodes, gpus, batch={"global": 256}, ft=ft, ds=ds))
    d = resolve(j, inputs(model, gib))
    assert d.per_device * d.grad_accum * world == 256
    assert set(d.chosen) == {"per_device", "grad_accum", "gradient_checkpointing"}
    options = [(m, c) for m in range(1, 256 // world + 1) if (256 // world) % m == 0 for c in (False, True)]
    fitting = [(m, c) for m, c in options if fits(j, model, m, c, d.budget)]
    if not fitting:
        assert len(d.problems) == 1 and str(d.problems[0]).startswith("batch: nothing fits in ")
        return
    assert d.problems == ()
    assert (d.per_device, d.checkpointing) in fitting
    shape = memory.shape_from_config(MODELS[model])
    best = max(batchplan.speed(shape, 1024, batchplan.Candidate(m, c, 0, True)) for m, c in fitting)
    got = batchplan.speed(shape, 1024, batchplan.Candidate(d.per_device, d.checkpointing, 0, True))
    assert got == pytest.approx(best)
    bigger_off = [m for m, c in fitting if not c and m >= d.per_device]
    if d.checkpointing:   # on only when off fits nothing at least as large
        assert not bigger_off


def test_the_h200_case_picks_the_issues_fastest_measured_setting():
    """0.39 B LoRA, cutoff 1024, global 64 on one 140.4 GiB H200: 64 × 1 without checkpointing
    (72.2 samples/s in the issue's table, the fastest of its five)."""
    d = resolve(validate(job()), inputs("0.39b", 140.4))
    assert (d.per_device, d.grad_accum, d.checkpointing) == (64, 1, False)


def test_chosen_numbers_render_everywhere():
    """The YAML and ds_config carry the chosen numbers; train_batch_size = the global batch."""
    j = validate(job(2, 4, batch={"global": 128}, ds={"stage": 2}))
    plan = build_plan(j, run_id="R", memory=inputs("1.5b-150k", 80))
    d = plan.batch
    files = {posixpath.basename(f.path): f.content for f in plan.files}
    ds = json.loads(files["ds_config.json"])
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (d.per_device, d.grad_accum)
    assert ds["train_batch_size"] == 128
    lf = files["llamafactory.yaml"]
    assert f"per_device_train_batch_size: {d.per_device}\n" in lf
    assert f"gradient_accumulation_steps: {d.grad_accum}\n" in lf
    assert f"disable_gradient_checkpointing: {'false' if d.checkpointing else 'true'}\n" in lf


EXPLICIT = [({"per_device": 2, "grad_accum": 8}, {}), ({"per_device": 64, "global": 64}, {"gradient_checkpointing": False}),
            ({"per_device": 1, "grad_accum": 4, "global": 4}, {"gradient_checkpointing": True}),
            ({"per_device": 8}, {})]


@pytest.mark.parametrize("batch,training", EXPLICIT)
@pytest.mark.parametrize("gib", [None, 24, 140.4])
def test_explicit_settings_are_never_changed(batch, training, gib):
    """Given values render as given, whatever the memory inputs say (a misfit is refused, not
    rewritten); omitted checkpointing keeps today's default, true."""
    j = validate(job(batch=batch, training=training))
    base = build_plan(j, run_id="R")
    planned = build_plan(j, run_id="R", memory=inputs("0.39b", gib) if gib else None)
    assert [f.content for f in planned.files] == [f.content for f in base.files]
    d = planned.batch
    assert (d.per_device, d.grad_accum) == (batch["per_device"], batch.get("grad_accum", 1))
    assert d.checkpointing == training.get("gradient_checkpointing", True)
    assert d.chosen == ()
    # and the plan says which came from the spec and which from the default
    said = [ln for ln in memview.lines(d) if ln.startswith("batch:")][0]
    assert said.endswith("(gradient_checkpointing: the default)" if not training else "(all given in the spec)")


def test_partial_auto_keeps_the_given_half():
    j = validate(job(batch={"global": 64, "per_device": 16}, training={"gradient_checkpointing": "auto"}))
    d = resolve(j, inputs("0.39b", 140.4))
    assert (d.per_device, d.grad_accum, d.checkpointing, d.chosen) == (16, 4, False, ("gradient_checkpointing",))
    j = validate(job(batch={"global": 64, "grad_accum": 4}))
    d = resolve(j, inputs("0.39b", 140.4))
    assert (d.per_device, d.grad_accum) == (16, 4) and "grad_accum" not in d.chosen
    j = validate(job(batch={"global": 64}, training={"gradient_checkpointing": True}))
    d = resolve(j, inputs("0.39b", 140.4))
    assert d.checkpointing is True and d.per_device == 64 and "gradient_checkpointing" not in d.chosen


def test_refusal_explicit_setting_that_does_not_fit():
    j = validate(job(batch={"global": 64, "per_device": 64}, training={"gradient_checkpointing": False}))
    (p,) = resolve(j, inputs("0.39b", 100)).problems
    assert str(p) == unfit_64_line()


def test_refusal_nothing_fits_names_the_levers():
    j = validate(job(batch={"global": 64}, ft={"type": "full"}))
    (p,) = resolve(j, inputs("7b", 80)).problems
    assert str(p).startswith("batch: nothing fits in 80.0 GiB per GPU (72.0 usable with 10% kept free): "
                             "even per_device 1 with gradient checkpointing on needs an estimated ")
    assert str(p).endswith("; use deepspeed stage 3 (model states ÷ GPUs), deepspeed offload_optimizer: "
                           "cpu, finetuning type lora, a shorter cutoff_len (or --force-unfit)")
    # 8 GPUs with ZeRO-3 make it fit
    assert not resolve(validate(job(1, 8, batch={"global": 64}, ft={"type": "full"}, ds={"stage": 3})),
                       inputs("7b", 80)).problems


def test_assumed_gpu_memory_refuses_nothing_and_says_so():
    j = validate(job(batch={"global": 64, "per_device": 64}, training={"gradient_checkpointing": False}))
    d = resolve(j, MemoryInputs(model_config=QWEN_039, config_source="test"))
    assert d.problems == ()
    assert d.why[0] == "GPU memory: assumed 80 GiB (unknown); set cluster.gpu_memory_gb"
    assert any(w.startswith(f"would not fit the assumed 80 GiB: estimated {gib('0.39b', 64, False):.1f} GiB")
               for w in d.why)


def test_unreadable_config_falls_back_cautiously_and_says_so():
    d = resolve(validate(job()), MemoryInputs(gpu_gib=80, config_source="/m/config.json is not on this machine"))
    assert (d.per_device, d.grad_accum, d.checkpointing, d.estimate) == (4, 16, True, None)
    assert d.why == ("model config.json not readable (/m/config.json is not on this machine): no memory "
                     "estimate; chose the cautious per_device 4, gradient checkpointing on; give "
                     "batch.per_device and training.gradient_checkpointing to decide yourself",)


@pytest.mark.parametrize("batch,line", [
    ({}, "batch.global: required when mlaunch chooses per_device or grad_accum (omitted or auto): "
         "give the global batch, e.g. global: 64"),
    ({"global": 60}, "batch.global: 60 is not a multiple of 1 node × 8 GPUs = 8; set global to a multiple of 8"),
    ({"global": 64, "grad_accum": 3}, "batch.global: 64 is not a multiple of 1 node × 8 GPUs × 3 accumulation "
                                      "= 24; set global to a multiple of 24"),
])
def test_spec_refusals_are_one_line(batch, line):
    from launcher.errors import SpecError
    with pytest.raises(SpecError) as e:
        validate(job(1, 8, batch=batch))
    assert [str(p) for p in e.value.problems] == [line]


def model_dir(tmp_path, cfg=QWEN_039) -> str:
    d = os.path.join(str(tmp_path), "model")
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    return d


def cli_spec(tmp_path, **kw) -> str:
    data = job(**kw)
    data["cluster"]["hosts"], data["cluster"]["master_addr"] = ["localhost"], None
    data["cluster"].pop("master_addr")
    data["model"] = model_dir(tmp_path)
    return write_spec(tmp_path, data)


def test_mlaunch_plan_table_and_json(tmp_path):
    path = cli_spec(tmp_path, gpu_memory_gb=140.4)
    r = mlaunch("plan", path)
    assert r.returncode == 0, r.stderr
    est = memory.estimate(memory.shape_from_config(QWEN_039), memory.Setting(
        lora_rank=16, seq_len=1024, micro_batch=64, checkpointing=False)).gib()
    assert f"  activations                    {est['activations']:>8.2f}\n" in r.stdout
    assert ("batch: per_device 64 × grad_accum 1, gradient checkpointing off (chosen by mlaunch: "
            "per_device, grad_accum, gradient_checkpointing)") in r.stdout
    assert "  GPU memory: 140.4 GiB (cluster.gpu_memory_gb)" in r.stdout
    j = json.loads(mlaunch("plan", path, "--json").stdout)
    assert (j["per_device"], j["grad_accum"], j["gradient_checkpointing"]) == (64, 1, False)
    assert j["estimate_gib"] == est and j["problems"] == []


def test_unfit_batch_is_refused_by_plan_and_dry_run_unless_forced(tmp_path):
    path = cli_spec(tmp_path, gpu_memory_gb=100, batch={"global": 64, "per_device": 64},
                    training={"gradient_checkpointing": False})
    line = f"mlaunch: {unfit_64_line()}\n"
    for args in (("plan", path), ("submit", "--dry-run", path)):
        r = mlaunch(*args)
        assert r.returncode == 2 and r.stderr.endswith(line), r.stderr
        assert "Traceback" not in r.stderr
    r = mlaunch("submit", "--dry-run", "--force", path)
    assert r.returncode == 0 and "per_device_train_batch_size: 64\n" in r.stdout


def test_dry_run_without_gpu_memory_says_what_it_assumed(tmp_path):
    r = mlaunch("submit", "--dry-run", cli_spec(tmp_path))
    assert r.returncode == 0, r.stderr
    assert ("  GPU memory: assumed 80 GiB (not known without preflight); set cluster.gpu_memory_gb, "
            "or submit (preflight reads nvidia-smi)\n") in r.stdout
    n = int(re.search(r"^batch: per_device (\d+) ×", r.stdout, re.M)[1])
    assert f"per_device_train_batch_size: {n}\n" in r.stdout
    assert gib("0.39b", n, False) <= 72 < gib("0.39b", 2 * n, False)   # the largest that fits 80 GiB


def test_preflight_memory_facts_take_the_smallest_used_gpu_and_node0s_config():
    from launcher.preflight.gpu import memory_facts
    from launcher.preflight.probe import Ctx
    j = validate(job(2, 2, batch={"global": 64}))
    plan = build_plan(j, run_id="R")
    smi = "0, U0, 550.1, 10, {a}\n1, U1, 550.1, 10, {b}\n2, U2, 550.1, 10, 1000\n"
    facts = {0: {"gpu": {"smi": "/x", "code": 0, "gpus": smi.format(a=143771, b=143771)},
                 "model_config": {"config": QWEN_039}},
             1: {"gpu": {"smi": "/x", "code": 0, "gpus": smi.format(a=143771, b=81559)}}}
    got = memory_facts(Ctx(plan, executor=None), facts)
    assert got == {"gpu_mib": 81559, "model_config": QWEN_039}   # GPU 2 (1000 MiB) is not used
    from launcher.plan.meminputs import inputs as mem_inputs
    m = mem_inputs(j.model_copy(update={"cluster": j.cluster.model_copy(update={"gpu_memory_gb": 70})}), got)
    assert m.gpu_gib == 70 and m.model_config == QWEN_039 and m.config_source.endswith("read on node 0")


@pytest.mark.multihost
def test_preflight_brings_back_node0s_model_config(make_hostset, tmp_path):
    """The facts probe reads config.json on node 0 over SSH; no GPU here, so no memory figure."""
    import sys

    with make_hostset(2) as hs:
        data = job(2, 1, batch={"global": 64})
        data["cluster"] = {"hosts": [h.ip for h in hs.hosts], "gpus_per_node": 1, "python": sys.executable,
                           "env": {"GLOO_SOCKET_IFNAME": "eth0"},
                           "ssh": {"user": "root", "key_file": hs.key_file, "known_hosts": hs.known_hosts}}
        data["model"], data["output_dir"] = model_dir(tmp_path, QWEN_15), str(tmp_path / "out")
        data["preflight"] = {"min_free_gb": 0.5, "min_shm_mb": 16, "check_timeout_s": 10}
        report = preflight(data)
    assert report.memory == {"gpu_mib": None, "model_config": QWEN_15}


def test_swift_jobs_are_planned_too_and_megatron_is_refused():
    from launcher.plan.trainers import TRAINERS, RunContext
    from .test_swift import swift_lora, swift_megatron
    data = swift_lora()
    data["batch"] = {"global": 64}
    data["training"].pop("gradient_checkpointing", None)
    plan = build_plan(validate(data), run_id="R", memory=inputs("1.5b-150k", 80))
    d = plan.batch
    assert d.chosen and d.per_device * d.grad_accum * 8 == 64
    args = TRAINERS["swift"].entry(plan.job, RunContext("R", "/tmp/r"))
    i = args.index("--per_device_train_batch_size")
    assert args[i + 1] == str(d.per_device) and args[args.index("--gradient_accumulation_steps") + 1] == str(d.grad_accum)
    assert args[args.index("--gradient_checkpointing") + 1] == str(d.checkpointing).lower()
    mega = swift_megatron()
    mega["batch"] = {"global": 64}
    from launcher.errors import SpecError
    with pytest.raises(SpecError) as e:
        validate(mega)
    assert "batch.per_device: mlaunch's batch planning does not cover Megatron-SWIFT: give per_device " \
           "(and grad_accum), and gradient_checkpointing true or false" in [str(p) for p in e.value.problems]


def test_refusal_without_global_suggests_a_bound():
    """No global batch: the bound is the largest per_device that fits, by the estimate."""
    import re
    j = validate(job(batch={"per_device": 64}, training={"gradient_checkpointing": True}))
    d = resolve(j, inputs("0.39b", 24))
    (p,) = d.problems
    m = re.fullmatch(r"batch: estimated ([\d.]+) GiB per GPU of 24\.0 \(21\.6 usable\) with per_device 64, "
                     r"gradient checkpointing on: per_device ≤ (\d+) \(or --force-unfit\)", str(p))
    assert m, str(p)
    assert float(m[1]) == round(d.estimate.total / memory.GIB, 1)
    n = int(m[2])
    assert fits(j, "0.39b", n, True, d.budget) and not fits(j, "0.39b", n + 1, True, d.budget)


def test_render_writes_the_batch_the_dry_run_shows(tmp_path):
    """A batch mlaunch picks from the model's config.json and cluster.gpu_memory_gb: `mlaunch
    render` wrote another one (its plan was made without the memory inputs the dry run uses)."""
    path = cli_spec(tmp_path, gpu_memory_gb=80, batch={"global": 128})
    dry = mlaunch("submit", "--dry-run", path)
    assert dry.returncode == 0, dry.stderr
    want = re.search(r"^per_device_train_batch_size: (\d+)\n(?:.*\n)*?gradient_accumulation_steps: (\d+)$",
                     dry.stdout, re.M)
    r = mlaunch("render", path, "--out", str(tmp_path / "rendered"))
    assert r.returncode == 0 and want, r.stderr
    yaml_text = next(open(p).read() for p in r.stdout.split() if p.endswith(".yaml"))
    assert f"per_device_train_batch_size: {want[1]}\n" in yaml_text
    assert f"gradient_accumulation_steps: {want[2]}\n" in yaml_text

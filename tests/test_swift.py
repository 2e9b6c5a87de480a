"""ms-swift trainer: the exact argv mlaunch renders, and one clear line per swift mistake."""
from __future__ import annotations

import copy
import json
import os

import pytest

from launcher.errors import SpecError
from launcher.plan.launch_plan import build_plan
from launcher.spec import SWIFT_OWNED, load_spec, validate
from launcher.plan.trainers import TRAINERS, RunContext

from .helpers import CONFIGS, load_yaml, set_path

SWIFT_LORA = os.path.join(CONFIGS, "seed003-qwen2.5-14b-swift-lora.yaml")
SWIFT_MEGATRON = os.path.join(CONFIGS, "seed003-qwen2.5-14b-swift-megatron.yaml")
RUN = RunContext(run_id="R", run_dir="/runs/R")

# Rendered after torchrun's own options for seed 003's 2 x 4 LoRA job (DDP).
LORA_ARGV = [
    "-m", "swift.cli.sft",
    "--model", "/data/models/Qwen2.5-14B-Instruct", "--model_type", "qwen2", "--template", "qwen2_5",
    "--dataset", "/data/work/data/alpaca_zh_demo.json", "/data/work/data/identity.json",
    "--max_length", "2048", "--tuner_type", "lora", "--lora_rank", "8", "--lora_alpha", "32",
    "--lora_dropout", "0.05", "--target_modules", "all-linear",
    "--torch_dtype", "bfloat16",
    "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "8",
    "--learning_rate", "0.0001", "--lr_scheduler_type", "cosine", "--warmup_ratio", "0.03",
    "--num_train_epochs", "3.0", "--max_grad_norm", "1.0", "--gradient_checkpointing", "true",
    "--save_steps", "100", "--logging_steps", "5", "--seed", "42",
    "--output_dir", "/data/work/output/qwen25-14b-swift-lora", "--check_model", "false",
]


def swift_lora() -> dict:
    return copy.deepcopy(load_yaml(SWIFT_LORA))


def swift_megatron() -> dict:
    return copy.deepcopy(load_yaml(SWIFT_MEGATRON))


def argv(data: dict, run: RunContext = RUN) -> list[str]:
    job = validate(data)
    return TRAINERS["swift"].entry(job, run)


def flags(args: list[str]) -> dict[str, list[str]]:
    """--flag -> its values, for checks that do not care about order."""
    out: dict[str, list[str]] = {}
    key = None
    for a in args[2:]:
        if a.startswith("--"):
            key = a[2:]
            out[key] = []
        else:
            out[key].append(a)
    return out


def problems(data: dict) -> list[str]:
    with pytest.raises(SpecError) as err:
        validate(data)
    return [str(p) for p in err.value.problems]


# --- rendering ------------------------------------------------------------------------

def test_lora_argv_exact():
    assert argv(swift_lora()) == LORA_ARGV


def test_lora_node_script_starts_the_entry_under_mlaunchs_torchrun():
    plan = build_plan(load_spec(SWIFT_LORA), run_id="R")
    for node in plan.nodes:
        head = list(node.argv[:node.argv.index("-m")])
        assert head[1:9] == ["--nnodes", "2", "--nproc-per-node", "4", "--node-rank", str(node.rank),
                             "--master-addr", "10.0.0.1"]
        assert list(node.argv[node.argv.index("-m"):]) == LORA_ARGV
        # swift's own NNODES/NODE_RANK re-launch is never triggered: mlaunch sets none of them.
        assert not {"NNODES", "NODE_RANK", "NPROC_PER_NODE"} & {k for k, _ in node.env}
    assert plan.files == ()
    assert TRAINERS["swift"].discovery_args(plan.job) == []


def test_full_argv():
    data = swift_lora()
    data["finetuning"] = {"type": "full"}
    data["precision"] = "fp16"
    data["training"].update(max_steps=200, warmup_steps=10, gradient_checkpointing=False)
    for k in ("epochs", "warmup_ratio"):
        data["training"].pop(k)
    f = flags(argv(data))
    assert f["tuner_type"] == ["full"]
    assert not {"lora_rank", "lora_alpha", "target_modules", "deepspeed"} & set(f)
    # swift derives bf16/fp16 from torch_dtype; only fp32 states both off (it would pick fp16 AMP).
    assert f["torch_dtype"] == ["float16"] and "bf16" not in f and "fp16" not in f
    data["precision"] = "fp32"
    f = flags(argv(data))
    assert (f["torch_dtype"], f["bf16"], f["fp16"]) == (["float32"], ["false"], ["false"])
    assert (f["max_steps"], f["warmup_steps"], f["gradient_checkpointing"]) == (["200"], ["10"], ["false"])
    assert "num_train_epochs" not in f and "warmup_ratio" not in f


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_argv_and_ds_config(stage):
    data = swift_lora()
    data["deepspeed"] = {"stage": stage}
    job = validate(data)
    args = TRAINERS["swift"].entry(job, RUN)
    assert args[args.index("--deepspeed") + 1] == "/runs/R/ds_config.json"
    assert args.index("--deepspeed") == args.index("--gradient_checkpointing") + 2
    (ds_file,) = TRAINERS["swift"].files(job, RUN)
    assert ds_file.path == "/runs/R/ds_config.json"
    ds = json.loads(ds_file.content)
    assert ds["train_batch_size"] == 64 and ds["gradient_accumulation_steps"] == 8
    assert ds["train_micro_batch_size_per_gpu"] == 1 and ds["zero_optimization"]["stage"] == stage
    assert "optimizer" not in ds  # ms-swift builds its own (its defaults: weight_decay 0.1, beta2 0.95)
    # "auto" only for the buckets transformers sizes from the model (no config.json here).
    assert {k for k, v in ds["zero_optimization"].items() if v == "auto"} == (
        {"reduce_bucket_size"} | ({"stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"}
                                  if stage == 3 else set()))
    # The checkpoint scan then demands one optimizer shard per data-parallel rank.
    assert TRAINERS["swift"].discovery_args(job) == ["--deepspeed", "--dp-size", "8"]


def test_megatron_argv_exact():
    assert argv(swift_megatron()) == [
        "-m", "swift.cli._megatron.sft",
        "--model", "/data/models/Qwen2.5-14B-Instruct", "--model_type", "qwen2",
        "--dataset", "/data/work/data/alpaca_zh_demo.json", "--max_length", "4096",
        "--tuner_type", "lora", "--lora_rank", "8", "--lora_alpha", "32", "--lora_dropout", "0.05",
        "--target_modules", "all-linear",
        "--torch_dtype", "bfloat16",
        "--tensor_model_parallel_size", "2", "--pipeline_model_parallel_size", "2",
        "--sequence_parallel", "true", "--micro_batch_size", "1", "--global_batch_size", "32",
        "--lr", "0.0001", "--lr_decay_style", "cosine", "--lr_warmup_fraction", "0.03",
        "--num_train_epochs", "1", "--clip_grad", "1.0",
        "--recompute_granularity", "selective",  # Megatron-SWIFT's default: the spec leaves it out
        "--save_steps", "100", "--logging_steps", "5", "--seed", "42",
        "--output_dir", "/data/work/output/qwen25-14b-swift-megatron", "--check_model", "false",
    ]


def test_resume_argv():
    run = RunContext(run_id="R", run_dir="/runs/R", resume_from="/o/v0-20260101-000000/checkpoint-5")
    f = flags(argv(swift_lora(), run))
    assert f["resume_from_checkpoint"] == ["/o/v0-20260101-000000/checkpoint-5"]
    # Megatron-SWIFT 4.x resumes from v<N>-*/checkpoint-<iter> (its tracker names the iteration),
    # exactly the path discovery returns (tests/test_checkpoints.py plants that layout).
    ckpt = "/o/v0-20260101-000000/checkpoint-200"
    run = RunContext(run_id="R", run_dir="/runs/R", resume_from=ckpt)
    f = flags(argv(swift_megatron(), run))
    assert f["mcore_adapter"] == [ckpt] and f["finetune"] == ["false"] and "mcore_model" not in f
    data = swift_megatron()
    data["finetuning"] = {"type": "full"}
    f = flags(argv(data, run))
    assert f["mcore_model"] == [ckpt] and f["finetune"] == ["false"] and "mcore_adapter" not in f
    assert TRAINERS["swift"].discovery_args(validate(data)) == ["--megatron"]


def test_freeze_maps_to_trainable_layers(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 24}))
    data = swift_lora()
    data["model"] = str(tmp_path)
    data["finetuning"] = {"type": "freeze", "freeze_trainable_layers": 2,
                          "freeze_trainable_modules": "mlp,self_attn"}
    f = flags(argv(data))
    assert f["tuner_type"] == ["full"] and f["freeze_parameters_ratio"] == ["1"]
    assert f["trainable_parameters_regex"] == [r"\.layers\.(22|23)\.(mlp|self_attn)\."]
    data["finetuning"] = {"type": "freeze", "freeze_trainable_layers": -1}
    assert flags(argv(data))["trainable_parameters_regex"] == [r"\.layers\.(0)\."]


def test_passthrough_values_and_hub_model():
    data = swift_lora()
    data["model"] = "Qwen/Qwen2.5-14B-Instruct"   # a hub id: swift may check it
    data["passthrough"] = {"report_to": ["tensorboard"], "columns": {"q": "query"},
                           "save_only_model": False, "system": "You are a helpful assistant."}
    args = argv(data)
    assert "--check_model" not in args
    assert args[-8:] == ["--report_to", "tensorboard", "--columns", '{"q": "query"}',
                         "--save_only_model", "false", "--system", "You are a helpful assistant."]


def test_every_rendered_flag_is_owned():
    for data in (swift_lora(), swift_megatron()):
        rendered = {a[2:] for a in argv(data) if a.startswith("--")}
        assert rendered <= set(SWIFT_OWNED)


# --- validation: Megatron arithmetic and seed 003's pitfalls -------------------------

def mega(tmp_path=None, layers=None, heads=None, **megatron) -> dict:
    data = swift_megatron()
    data["megatron"] = megatron
    if tmp_path is not None:
        (tmp_path / "config.json").write_text(json.dumps(
            {"num_hidden_layers": layers, "num_attention_heads": heads}))
        data["model"] = str(tmp_path)
    return data


def test_seed003_tp4_pp20_rejected():
    # Seed 003: "Qwen2.5-70B has 80 layers, so set TP x PP to a factor of 80 (TP=4, PP=20)".
    lines = problems(mega(tp=4, pp=20))
    assert lines[0] == ("megatron: tp 4 × pp 20 = 80 does not divide the world size 8 (2 nodes × 4 "
                        "GPUs), so no whole number of data-parallel replicas fits; choose tp × pp "
                        "among 1, 2, 4, 8")


def test_pp_must_divide_layers(tmp_path):
    lines = problems(mega(tmp_path, layers=30, heads=40, tp=2, pp=4))
    assert f"megatron.pp: the model has 30 layers ({tmp_path}/config.json), not divisible by pp 4; " \
           "choose pp among 1, 2, 3, 5, 6, 10, 15, 30" in lines, lines
    data = mega(tmp_path, layers=48, heads=40, tp=2, pp=4)
    data["batch"]["global"] = 16
    assert validate(data).megatron.pp == 4


def test_tp_must_divide_heads(tmp_path):
    lines = problems(mega(tmp_path, layers=48, heads=12, tp=8, pp=1))
    assert any(line.startswith("megatron.tp: the model has 12 attention heads") and
               "not divisible by tp 8; choose tp among 1, 2, 3, 4, 6, 12" in line for line in lines), lines


def test_megatron_batch_uses_data_parallel_size():
    data = mega(tp=2, pp=2)
    data["batch"]["global"] = 128  # 8 GPUs x 1 x 16: right for DDP, wrong for dp = 2
    assert problems(data) == ["batch.global: 128 ≠ dp 2 × 1 per device × 16 accumulation = 32 (dp = 8 "
                              "GPUs / (tp 2 × pp 2)); set global to 32, change per_device/grad_accum, "
                              "or omit global"]


def test_ddp_batch_arithmetic_as_llamafactory():
    data = swift_lora()
    data["batch"]["global"] = 32
    assert problems(data)[0].startswith("batch.global: 32 ≠ 2 nodes × 4 GPUs × 1 per device × 8 accumulation = 64")


CASES = [
    # seed 003's DDP example passes --deepspeed zero2 to a "DDP" job
    ("passthrough", {"deepspeed": "zero2"}, "passthrough.deepspeed: mlaunch renders the DeepSpeed config"),
    # seed 003's one-MASTER_PORT-per-node "fix"
    ("cluster.env", {"MASTER_PORT": "29501"}, "cluster.env.MASTER_PORT: set by mlaunch from cluster.master_port"),
    ("cluster.env", {"NODE_RANK": "1"}, "cluster.env.NODE_RANK: set by mlaunch"),
    ("passthrough", {"train_type": "lora"}, "passthrough.train_type: ms-swift 4.x rejects --train_type"),
    ("passthrough", {"per_device_train_batch_size": 2}, "passthrough.per_device_train_batch_size: mlaunch owns this argument; set batch.per_device instead"),
    ("passthrough", {"gradient_accumulation_steps": 4}, "passthrough.gradient_accumulation_steps: mlaunch owns this argument; set batch.grad_accum"),
    ("passthrough", {"tensor_model_parallel_size": 2}, "passthrough.tensor_model_parallel_size: mlaunch owns this argument; set megatron.tp"),
    ("passthrough", {"--lr": 1}, "passthrough.--lr: not an ms-swift argument name"),
    ("passthrough", {"use_cpu": True}, "passthrough.use_cpu: not needed on CPU hosts"),
    ("passthrough", {"system": ""}, "passthrough.system: empty value"),
    ("finetuning", {"type": "full", "lora_rank": 8}, "finetuning.lora_rank: only applies to type lora"),
    ("finetuning", {"type": "freeze", "freeze_trainable_layers": 2}, "finetuning.freeze_trainable_layers: swift selects trainable layers by index"),
    ("deepspeed", {"stage": 2, "offload_param": "cpu"}, "deepspeed.offload_param: parameter offload exists only in ZeRO-3"),
    ("training.max_steps", 10, "training: give exactly one of epochs or max_steps"),
    ("max_lenght", 10, "max_lenght: unknown key; did you mean 'max_length'?"),
]


@pytest.mark.parametrize("path,value,expected", CASES, ids=[c[0] + "=" + repr(c[1])[:24] for c in CASES])
def test_each_swift_mistake_has_its_line(path, value, expected):
    lines = problems(set_path(swift_lora(), path, value))
    assert any(line.startswith(expected) for line in lines), lines


MEGATRON_CASES = [
    ("deepspeed", {"stage": 2}, "deepspeed: Megatron-SWIFT does its own parallelism"),
    ("finetuning", {"type": "freeze", "freeze_trainable_layers": -2}, "finetuning.type: freeze is not supported by mlaunch's Megatron-SWIFT mode"),
    ("finetuning", {"type": "lora", "quantization_bit": 4}, "finetuning.quantization_bit: Megatron-SWIFT does not train quantized"),
    ("training.lr_scheduler", "polynomial", "training.lr_scheduler: polynomial has no Megatron equivalent"),
    ("training.epochs", 1.5, "training.epochs: Megatron-SWIFT counts whole epochs"),
]


@pytest.mark.parametrize("path,value,expected", MEGATRON_CASES, ids=[c[0] for c in MEGATRON_CASES])
def test_each_megatron_mistake_has_its_line(path, value, expected):
    lines = problems(set_path(swift_megatron(), path, value))
    assert any(line.startswith(expected) for line in lines), lines


def test_ddp_deepspeed_message_explains_the_difference():
    data = swift_lora()
    data["passthrough"] = {"deepspeed": "zero2"}
    (line,) = problems(data)
    assert "For plain DDP leave deepspeed out entirely" in line and "runs DeepSpeed ZeRO, not DDP" in line


def test_examples_validate():
    assert load_spec(SWIFT_LORA).trainer == "swift"
    assert load_spec(SWIFT_MEGATRON).megatron.tp == 2

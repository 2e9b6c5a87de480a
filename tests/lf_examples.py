"""The keys of LLaMA-Factory v0.9.5's examples (commit 7af9095), recorded by hand for the
acceptance corpus: configs/lf-examples/<name>.yaml is the mlaunch spec of example <name>.

Each example is BASE (the keys every train_* example shares) plus its own keys; a value of
None removes a BASE key the example does not have. `resume_from_checkpoint: null`, which
most examples state, is the default and not recorded. examples/deepspeed/*.json are exercised
through qwen3_lora_sft_ds3, the example whose comment lists the config choices.
"""
from __future__ import annotations

Q3, VL = "Qwen/Qwen3-4B-Instruct-2507", "Qwen/Qwen3-VL-4B-Instruct"
BASE = {
    "model_name_or_path": Q3, "trust_remote_code": True, "stage": "sft", "do_train": True,
    "finetuning_type": "lora", "lora_rank": 8, "lora_target": "all",
    "dataset": "identity,alpaca_en_demo", "template": "qwen3_nothink", "cutoff_len": 2048,
    "max_samples": 1000, "preprocessing_num_workers": 16, "dataloader_num_workers": 4,
    "output_dir": "saves/qwen3-4b/lora/sft", "logging_steps": 10, "save_steps": 500, "plot_loss": True,
    "overwrite_output_dir": True, "save_only_model": False, "report_to": "none",
    "per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "learning_rate": 1.0e-4,
    "num_train_epochs": 3.0, "lr_scheduler_type": "cosine", "warmup_ratio": 0.1, "bf16": True,
    "ddp_timeout": 180000000,
}
FULL = {"finetuning_type": "full", "lora_rank": None, "lora_target": None,
        "deepspeed": "examples/deepspeed/ds_z3_config.json", "gradient_accumulation_steps": 2,
        "learning_rate": 1.0e-5}
VLX = {"model_name_or_path": VL, "image_max_pixels": 262144, "video_max_pixels": 16384,
       "template": "qwen3_vl_nothink"}
LLAMA3 = {"template": "llama3", "output_dir": "saves/llama3-8b/lora/sft"}
DS3 = {"deepspeed": "examples/deepspeed/ds_z3_config.json", "gradient_accumulation_steps": 2}

OWN = {
    "qwen3_full_sft": {**FULL, "output_dir": "saves/qwen3-4b/full/sft"},
    "qwen3vl_full_sft": {**FULL, **VLX, "freeze_vision_tower": True, "freeze_multi_modal_projector": True,
                         "freeze_language_model": False, "dataset": "mllm_demo,identity,alpaca_en_demo",
                         "output_dir": "saves/qwen3-vl-4b/full/sft"},
    "qwen3_lora_dpo": {"stage": "dpo", "pref_beta": 0.1, "pref_loss": "sigmoid", "dataset": "dpo_en_demo",
                       "output_dir": "saves/qwen3-4b/lora/dpo", "learning_rate": 5.0e-6},
    "qwen3_lora_kto": {"stage": "kto", "pref_beta": 0.1, "dataset": "kto_en_demo", "save_only_model": None,
                       "output_dir": "saves/qwen3-4b/lora/kto", "learning_rate": 5.0e-6},
    "qwen3_lora_pretrain": {"stage": "pt", "dataset": "c4_demo", "template": None,
                            "output_dir": "saves/qwen3-4b/lora/pretrain"},
    "qwen3_lora_reward": {"stage": "rm", "dataset": "dpo_en_demo", "output_dir": "saves/qwen3-4b/lora/reward"},
    "qwen3_lora_sft": {},
    "qwen3_lora_sft_ds3": dict(DS3),
    "qwen3vl_lora_dpo": {**VLX, "stage": "dpo", "pref_beta": 0.1, "pref_loss": "sigmoid", "dataset": "rlhf_v",
                         "output_dir": "saves/qwen3-vl-4b/lora/dpo", "learning_rate": 5.0e-6},
    "qwen3vl_lora_sft": {**VLX, "dataset": "mllm_demo,identity,alpaca_en_demo",
                         "output_dir": "saves/qwen3-vl-4b/lora/sft"},
    "llama3_lora_sft_aqlm": {**LLAMA3, "model_name_or_path": "ISTA-DASLab/Meta-Llama-3-8B-Instruct-AQLM-2Bit-1x16"},
    "llama3_lora_sft_awq": {**LLAMA3, "model_name_or_path": "TechxGenus/Meta-Llama-3-8B-Instruct-AWQ"},
    "llama3_lora_sft_gptq": {**LLAMA3, "model_name_or_path": "TechxGenus/Meta-Llama-3-8B-Instruct-GPTQ"},
    "qwen3_lora_sft_bnb_npu": {"quantization_bit": 4, "quantization_method": "bnb", "double_quantization": False,
                               "resume_from_checkpoint": None},
    "qwen3_lora_sft_otfq": {"quantization_bit": 4, "quantization_method": "bnb"},
    # Tokenize only: no training keys at all, so the Trainer's defaults apply.
    "qwen3_preprocess": {k: None for k in BASE if k not in (
        "model_name_or_path", "trust_remote_code", "stage", "do_train", "finetuning_type", "lora_rank",
        "lora_target", "dataset", "template", "cutoff_len", "max_samples", "preprocessing_num_workers",
        "output_dir", "overwrite_output_dir")} | {"tokenized_path": "saves/qwen3-4b/dataset/sft"},
    **{f"qwen3_lora_sft_{ds}": {**DS3, "deepspeed": f"examples/deepspeed/{ds}_config.json"}
       for ds in ("ds_z0", "ds_z2", "ds_z2_offload", "ds_z3_offload", "ds_z3_fp8")},
}
# Examples that mlaunch refuses, with the start of the one line it prints.
REFUSED = {"qwen3_lora_sft_ray": "passthrough.ray_num_workers: LLaMA-Factory's own Ray mode would "
                                 "start a Ray job on every rank; set cluster.scheduler: ray"}


def example(name: str) -> dict:
    """The example's effective YAML keys (BASE with its own keys applied)."""
    out = {**BASE, **OWN[name]}
    return {k: v for k, v in out.items() if v is not None}

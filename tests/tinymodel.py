"""Build a tiny, deterministic Qwen2 model + alpaca dataset for CPU training tests.

Importable with the standard library alone: ``transformers``, ``tokenizers`` and
``torch`` are imported lazily inside :func:`build_tiny`, so test collection
works in an interpreter that does not have them (the trainer venv built by
``tests/env/make_trainer_venv.sh`` does).

Nothing is downloaded: the tokenizer is trained here with the ``tokenizers``
library (byte-level BPE) and the model is randomly initialised from a seed.

Usage::

    from tests.tinymodel import build_tiny
    info = build_tiny("/tmp/tiny")   # {"model": ..., "dataset_dir": ..., ...}

or, with an interpreter that has transformers/tokenizers/torch::

    TRAINER_VENV/bin/python tests/tinymodel.py OUTDIR   # prints JSON of the paths

The result is meant for LLaMA-Factory with ``template: qwen``,
``dataset: tiny_alpaca`` and ``dataset_dir: <info["dataset_dir"]>``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys

DATASET_NAME = "tiny_alpaca"
TEMPLATE = "qwen"
NUM_EXAMPLES = 64
VOCAB_SIZE = 384

# Special tokens used by LLaMA-Factory's ``qwen`` template (ChatML).
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]

# Default system prompt of the ``qwen`` template in LLaMA-Factory; it is put into
# the tokenizer's training text so that it costs few tokens (cutoff_len is tiny).
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# A plain ChatML template written for this helper (used by tokenizer.apply_chat_template;
# LLaMA-Factory's ``qwen`` template formats training data on its own).
CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' -}}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{{- '<|im_start|>system\\n" + QWEN_DEFAULT_SYSTEM + "<|im_end|>\\n' -}}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_WORDS = [
    "apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "green",
    "north", "candle", "forest", "rocket", "silver", "window", "garden", "pepper",
]


def _make_examples(seed: int, n: int = NUM_EXAMPLES) -> list[dict]:
    """Simple synthetic instruction/output pairs, fully determined by ``seed``."""
    rng = random.Random(seed)
    out: list[dict] = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            ex = {"instruction": f"What is {a} plus {b}?", "input": "", "output": str(a + b)}
        elif kind == 1:
            w = rng.choice(_WORDS)
            ex = {"instruction": "Reverse the word.", "input": w, "output": w[::-1]}
        elif kind == 2:
            w = rng.choice(_WORDS)
            ex = {"instruction": "Write the word in capital letters.", "input": w, "output": w.upper()}
        else:
            ws = rng.sample(_WORDS, 3)
            ex = {"instruction": "Sort these words.", "input": " ".join(ws), "output": " ".join(sorted(ws))}
        out.append(ex)
    return out


def _corpus(examples: list[dict]):
    """Text the tokenizer is trained on: the data rendered with the ChatML markup."""
    for ex in examples:
        user = ex["instruction"] + ("\n" + ex["input"] if ex["input"] else "")
        yield (
            f"{IM_START}system\n{QWEN_DEFAULT_SYSTEM}{IM_END}\n"
            f"{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n{ex['output']}{IM_END}\n"
        )


def _train_tokenizer(examples: list[dict]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(_corpus(examples)), trainer=trainer)
    return tok


def build_tiny(dest: str, *, seed: int = 0) -> dict:
    """Write ``dest/model`` (tiny Qwen2ForCausalLM + tokenizer) and ``dest/data``.

    Returns a dict of paths and names (all JSON-serialisable)::

        {"root", "model", "dataset_dir", "dataset", "dataset_file",
         "dataset_info", "template", "num_examples", "vocab_size", "seed"}
    """
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    dest = os.path.abspath(dest)
    model_dir = os.path.join(dest, "model")
    data_dir = os.path.join(dest, "data")
    os.makedirs(model_dir, exist_ok=True)
    os.makedirs(data_dir, exist_ok=True)

    examples = _make_examples(seed)

    # --- data -------------------------------------------------------------
    data_file = os.path.join(data_dir, f"{DATASET_NAME}.json")
    with open(data_file, "w", encoding="utf-8") as f:
        json.dump(examples, f, indent=1, ensure_ascii=False)
        f.write("\n")
    info_file = os.path.join(data_dir, "dataset_info.json")
    with open(info_file, "w", encoding="utf-8") as f:
        json.dump(
            {
                DATASET_NAME: {
                    "file_name": f"{DATASET_NAME}.json",
                    "formatting": "alpaca",
                    "columns": {"prompt": "instruction", "query": "input", "response": "output"},
                }
            },
            f,
            indent=2,
        )
        f.write("\n")

    # --- tokenizer ----------------------------------------------------------
    tok = _train_tokenizer(examples)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=512,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(model_dir)

    # --- model ----------------------------------------------------------------
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        use_cache=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(model_dir, safe_serialization=True)

    return {
        "root": dest,
        "model": model_dir,
        "dataset_dir": data_dir,
        "dataset": DATASET_NAME,
        "dataset_file": data_file,
        "dataset_info": info_file,
        "template": TEMPLATE,
        "num_examples": len(examples),
        "vocab_size": config.vocab_size,
        "seed": seed,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (1, 2):
        print("usage: python tests/tinymodel.py OUTDIR [SEED]", file=sys.stderr)
        return 2
    seed = int(argv[1]) if len(argv) == 2 else 0
    # Libraries imported while building (deepspeed, via transformers) log to stdout;
    # keep stdout for the JSON alone.
    with contextlib.redirect_stdout(sys.stderr):
        info = build_tiny(argv[0], seed=seed)
    print(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

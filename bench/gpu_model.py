"""GPU proof helper: a ~0.39 B random Qwen2 (hidden 896, 24 layers, vocab 32768) with the tiny
locally trained tokenizer, and synthetic alpaca data of long examples. Nothing is downloaded.

Usage: python bench/gpu_model.py OUTDIR   (needs torch, transformers, tokenizers)
"""
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.tinymodel import build_tiny  # noqa: E402


def long_examples(n: int, seed: int = 0, words: int = 220) -> list[dict]:
    """Examples of several hundred tokens (more with more `words`): sorting long word lists."""
    rng = random.Random(seed)
    vocab = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]
    out = []
    for _ in range(n):
        text = " ".join(rng.choice(vocab) for _ in range(words))
        out.append({"instruction": "Repeat the words, sorted.", "input": text,
                    "output": " ".join(sorted(text.split()))})
    return out


def main(dest: str) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
    info = build_tiny(dest)
    tok = AutoTokenizer.from_pretrained(info["model"])
    cfg = Qwen2Config(vocab_size=32768, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(info["model"], safe_serialization=True)
    with open(info["dataset_file"], "w") as fh:
        json.dump(long_examples(2048), fh)
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({**info, "params": n}))


if __name__ == "__main__":
    main(sys.argv[1])

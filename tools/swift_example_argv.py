"""Transcribe ms-swift's example launch scripts into configs/swift-examples/examples.json.

    python tools/swift_example_argv.py /path/to/ms-swift-checkout COMMIT

For each corpus entry (SOURCES: spec name -> example script), reads the script at COMMIT
with `git show`, joins continued lines, substitutes the script's own shell variables and
`$(expr ...)`, and records the entry point (swift.sft, megatron.rlhf, ...) and the argument
list after it. tests/test_swift_examples.py parses both that list and mlaunch's rendering of
configs/swift-examples/<name>.yaml with ms-swift's own parser and compares them.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

SOURCES = {
    "multi-node-torchrun": "examples/train/multi-node/torchrun/train_node1.sh",
    "multi-node-swift": "examples/train/multi-node/swift/train_node1.sh",
    "multi-node-deepspeed": "examples/train/multi-node/deepspeed/train.sh",
    "multi-node-accelerate": "examples/train/multi-node/accelerate/train_node1.sh",
    "multi-gpu-ddp": "examples/train/multi-gpu/ddp/train.sh",
    "multi-gpu-zero2": "examples/train/multi-gpu/deepspeed/train_zero2.sh",
    "multi-gpu-zero3": "examples/train/multi-gpu/deepspeed/train_zero3.sh",
    "lora": "examples/train/lora_sft.sh",
    "qlora-bnb": "examples/train/qlora/bnb/train.sh",
    "full": "examples/train/full/train.sh",
    "dpo-lora": "examples/train/rlhf/dpo/lora.sh",
    "megatron-sft": "examples/megatron/sft.sh",
    "megatron-multi-node": "examples/megatron/multi-node/node1.sh",
    "megatron-lora": "examples/megatron/lora/dense.sh",
    "megatron-moe": "examples/megatron/moe/qwen3_moe.sh",
    "megatron-long-text": "examples/megatron/long_text.sh",
    "megatron-dpo": "examples/megatron/rlhf/dpo/dense.sh",
    "megatron-pt": "examples/megatron/pretrain.sh",
}
ENTRY = re.compile(r"(?:^|\s)(swift|megatron)\s+(sft|pt|rlhf)\s|swift/cli/(sft|pt|rlhf)\.py\s")
OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                   "configs", "swift-examples", "examples.json")


def _expand(text: str, env: dict[str, str]) -> str:
    """$var and $(expr a / b / c) as the shell would expand them in these scripts."""
    def expr(m):
        words = [env.get(w[1:], w) if w.startswith("$") else w for w in m.group(1).split()]
        value = int(words[0])
        for op, num in zip(words[1::2], words[2::2]):
            value = value // int(num) if op == "/" else value * int(num) if op == "*" else value + int(num)
        return str(value)
    text = re.sub(r"\$\(expr ([^)]*)\)", expr, text)
    return re.sub(r"\$([A-Za-z_][A-Za-z0-9_]*)", lambda m: env.get(m.group(1), m.group(0)), text)


def transcribe(script: str) -> tuple[str, list[str]]:
    """(entry, argv) of the one training command in an example script."""
    lines = [l for l in script.replace("\\\n", " ").splitlines() if not l.lstrip().startswith("#")]
    env = dict(re.findall(r"^([a-z_]+)=(\S+)$", "\n".join(lines), re.M))
    for line in lines:
        m = ENTRY.search(line + " ")
        if m:
            kind = m.group(1) or "swift"
            stage = m.group(2) or m.group(3)
            return f"{kind}.{stage}", shlex.split(_expand(line[m.end():], env))
    raise ValueError("no swift/megatron command found")


def main(repo: str, commit: str) -> int:
    out = {}
    for name, path in SOURCES.items():
        text = subprocess.run(["git", "-C", repo, "show", f"{commit}:{path}"], check=True,
                              capture_output=True, text=True).stdout
        entry, argv = transcribe(text)
        out[name] = {"source": path, "commit": commit, "entry": entry, "argv": argv}
    with open(OUT, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")
    print(f"{OUT}: {len(out)} examples at {commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

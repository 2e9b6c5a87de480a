"""One real FSDP run through mlaunch (issue 12 §6): the spec's `fsdp:` section on the GPUs of
one machine, LoRA or full fine-tuning of bench/gpu_model.py's 0.39 B Qwen2.

Each --torchrun mode (auto: a world of one runs in-process, as llamafactory-cli does; always:
torchrun even then) is one run; each appends one JSON line to OUTDIR/results.jsonl: exit code,
first and last logged loss, steps done, peak MiB per GPU (nvidia-smi), the rendered fsdp keys,
and for a failed run the log lines that name the error.

Usage, from the repo root of a GPU machine with LLaMA-Factory:
    python3 bench/fsdp_run.py OUTDIR [--torchrun auto,always] [--finetuning lora] [--steps 30]
            [--gpus 1] [--wheels DIR]
--cpu rehearses on CPU with the tiny test model (it checks this script, not the figures).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_proof as gp  # noqa: E402  (Setup, spec, train, mlaunch, install: one way to run a job)

FT = {"lora": {"type": "lora", "lora_rank": 16, "lora_target": "all"}, "full": {"type": "full"}}


def losses(out_dir: str) -> list[float]:
    """The logged losses of trainer_log.jsonl, in order."""
    path = os.path.join(out_dir, "trainer_log.jsonl")
    if not os.path.exists(path):
        return []
    rows = [json.loads(x) for x in open(path) if x.strip()]
    return [r["loss"] for r in rows if "loss" in r]


def error_lines(log: str) -> list[str]:
    """The lines of a failed run that say what failed: the exceptions raised (not torchrun's
    ChildFailedError wrapper), then mlaunch's own verdict."""
    text = open(log, errors="replace").read().splitlines()
    raised = [ln for ln in text if re.search(r"\b\w+(Error|Exception): ", ln) and "ChildFailedError" not in ln]
    verdict = [ln for ln in text if re.search(r"refuse|exit \d|failed \(exit", ln)]
    return [ln.rstrip()[:400] for ln in list(dict.fromkeys(raised))[-4:] + verdict[-3:]]


def rendered_fsdp(log: str) -> list[str]:
    """The fsdp lines of the rendered llamafactory.yaml of the run in `log`."""
    m = re.search(r"run (\S+):", open(log, errors="replace").read())
    path = f"/tmp/mlaunch/.mlaunch/{m[1]}/llamafactory.yaml" if m else ""
    if not os.path.exists(path):
        return []
    lines = open(path).read().splitlines()
    start = [i for i, ln in enumerate(lines) if ln.startswith("fsdp")]
    return [ln for i, ln in enumerate(lines) if start and start[0] <= i < start[0] + 6]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--torchrun", default="auto,always")
    ap.add_argument("--finetuning", default="lora", choices=sorted(FT))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--per-device", type=int, default=8)
    gp.machine_args(ap)
    a = ap.parse_args()
    s = gp.prepare(a.out, a.wheels, a.cpu, a.per_device)
    steps = 6 if a.cpu else a.steps
    for mode in a.torchrun.split(","):
        name = f"fsdp-{a.finetuning}-{mode}"
        path = gp.spec(s, name, steps=steps, gpus=a.gpus, finetuning=FT[a.finetuning],
                       fsdp={"sharding": "full_shard"})
        job = json.load(open(path))
        job["cluster"]["torchrun"] = mode
        job["training"]["logging_steps"] = 1
        json.dump(job, open(path, "w"), indent=1)
        out_dir = job["output_dir"]
        rec = gp.train(s, a.out, "fsdp", mode, 0, gp.mlaunch("submit", path), out_dir,
                       a.gpus * s.per_device, save=False, finetuning=a.finetuning, gpus=a.gpus)
        log = f"{a.out}/fsdp-{mode}-0.log"
        ls = losses(out_dir)
        rec.update(first_loss=ls[0] if ls else None, last_loss=ls[-1] if ls else None, logged_steps=len(ls),
                   rendered=rendered_fsdp(log), errors=[] if rec["rc"] == 0 else error_lines(log))
        gp.record(a.out, rec)


if __name__ == "__main__":
    main()

"""GPU proof of issue 15 (memory-aware batch planning) on one H200, through mlaunch.

Parts (each run appends one JSON line to OUTDIR/results.jsonl, also kept in /tmp/memory-proof):
  estimate  estimated vs measured peak memory (nvidia-smi every 200 ms, and each rank's
            torch.cuda.max_memory_reserved via an atexit hook) for 10 settings: LoRA and full,
            checkpointing on and off, no DeepSpeed, ZeRO-0 and ZeRO-3, on two random Qwen2
            shapes: the 0.39 B of bench/gpu_model.py and a 1.54 B with a 151,936 vocabulary
            (Qwen2.5-1.5B's shape). Rows feed bench/memory_fit.py as they are.
  sweep     a hand sweep at global batch 64 (0.39 B LoRA): checkpointing off 16×4, 32×2, 64×1,
            on 64×1, one run each; the fastest becomes `choice`'s hand setting
  choice    `batch: {global: 64}` chosen by mlaunch vs LLaMA-Factory's example habits
            (checkpointing on, 8 × 8; also under torch's allocator default) vs the best hand
            setting (the sweep's, else --hand, default the issue's fastest: off 64 × 1; with
            `--hand sweep` every SWEEP setting runs in every round), alternating, --runs rounds
            from round --first; samples/s, peaks, whether any run ran out of memory
Usage, from the repo root of a machine with one GPU:
    python3 bench/memory_proof.py OUTDIR [--parts estimate,choice] [--shapes 0.39b,1.5b-150k]
            [--steps 10] [--runs 3] [--wheels DIR] [--settings 4,8 --repeat 3] [--env KEY=VALUE]
--repeat runs the chosen estimate rows in that many alternating rounds; --env adds cluster.env
to every job (e.g. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False against mlaunch's default).
--cpu rehearses every part on CPU with tiny shapes (gloo, the trainer venv: MLAUNCH_TRAINER_VENV
or .venvs/trainer); it checks this script, not the figures. --summarize FILE... prints the tables.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

from gpu_proof import machine_args, mlaunch, prepare, Setup, train  # noqa: E402 (bench/ on sys.path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
W = "/tmp/memory-proof"
SHAPES = {   # random Qwen2 models, tied embeddings, built on the GPU
    "0.39b": dict(vocab_size=32768, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2),
    "1.5b-150k": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                      num_attention_heads=12, num_key_value_heads=2),
    # issue 30's ZeRO-2 shape: a 1.10 B Llama (TinyLlama-1.1B's numbers), untied, GQA 32/4
    "1.1b-llama": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                       num_attention_heads=32, num_key_value_heads=4),
}
LLAMA = {"1.1b-llama"}       # built as LlamaForCausalLM with untied embeddings; the rest Qwen2, tied
CPU_SHAPES = {
    "0.39b": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2),
    "1.5b-150k": dict(vocab_size=4096, hidden_size=64, intermediate_size=192, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2),
    "1.1b-llama": dict(vocab_size=1024, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2),
}
LORA = {"type": "lora", "lora_rank": 16, "lora_target": "all"}
FULL = {"type": "full"}
# (shape, finetuning, deepspeed stage or None, checkpointing, micro-batch[, cutoff_len])
ESTIMATE = [
    ("0.39b", LORA, None, False, 8), ("0.39b", LORA, None, True, 32), ("0.39b", FULL, None, False, 8),
    ("0.39b", FULL, 0, False, 8), ("0.39b", FULL, 3, True, 16),
    ("1.5b-150k", LORA, None, True, 8), ("1.5b-150k", LORA, None, False, 4), ("1.5b-150k", LORA, 3, False, 4),
    ("1.5b-150k", FULL, 3, True, 4), ("1.5b-150k", FULL, 0, False, 4),
    # ZeRO-2 (issue 30): the issue's row, its micro-batch 1 (the optimizer step's peak, not
    # backward's), the 0.39 B full beside row 3's ZeRO-0, and a LoRA row beside row 7's ZeRO-3
    ("1.1b-llama", FULL, 2, True, 8, 2048), ("1.1b-llama", FULL, 2, True, 1, 2048),
    ("0.39b", FULL, 2, False, 8), ("1.5b-150k", LORA, 2, False, 4),
]
EXTRA_ENV: dict[str, str] = {}   # --env KEY=VALUE: cluster.env of every job (e.g. the allocator)
SWEEP = [(False, 16, 4), (False, 32, 2), (False, 64, 1), (True, 64, 1)]
# Written next to the job as sitecustomize.py: each rank's allocator peak at exit. It shadows
# any other sitecustomize (the trainer venv's sets TORCH_EXTENSIONS_DIR), so it runs that one too.
PROBE = '''import atexit, importlib.util, json, os, sys
_here = os.path.dirname(os.path.abspath(__file__))
for _d in sys.path:
    _p = os.path.join(_d or ".", "sitecustomize.py")
    if os.path.abspath(_d or ".") != _here and os.path.isfile(_p):
        _spec = importlib.util.spec_from_file_location("_next_sitecustomize", _p)
        _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
        break
def _mlaunch_memprobe():
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return
        path = os.path.join(os.environ["MLAUNCH_MEMPROBE_DIR"], "rank%s.json" % os.environ.get("RANK", "0"))
        st = torch.cuda.memory_stats()
        with open(path, "w") as fh:
            json.dump({"max_reserved_mib": torch.cuda.max_memory_reserved() / 2**20,
                       "max_allocated_mib": torch.cuda.max_memory_allocated() / 2**20,
                       "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
                       "stats": {k: st.get(k) for k in ("num_alloc_retries", "num_ooms", "num_device_alloc",
                                                        "num_device_free", "active_bytes.all.peak",
                                                        "inactive_split_bytes.all.peak")}}, fh)
    except Exception:
        pass
if os.environ.get("MLAUNCH_MEMPROBE_DIR"):
    atexit.register(_mlaunch_memprobe)
'''


def install_deepspeed(wheels: list[str]) -> None:
    """The carried DeepSpeed sdist, built without ops into /tmp/site (FACTS.md: 16 s), once."""
    import glob
    import importlib.util
    sdists = sorted(p for d in wheels for p in glob.glob(f"{d}/deepspeed-*.tar.gz"))
    if not sdists or importlib.util.find_spec("deepspeed") is not None:
        return
    got = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                          "--no-build-isolation", "--no-cache-dir", "--target", "/tmp/site", sdists[-1]],
                         env={**os.environ, "DS_BUILD_OPS": "0"}, capture_output=True, text=True)
    if got.returncode:   # the ZeRO rows will then fail on their own; the others still run
        print(f"DeepSpeed sdist install failed (exit {got.returncode}): {got.stderr[-1500:]}", flush=True)


def build(dest: str, shape: str, cpu: bool) -> None:
    """(run with the trainer's python) The tiny tokenizer and long examples of gpu_model.py,
    and a random Qwen2 of `shape`; prints the info JSON."""
    sys.path.insert(0, ROOT)
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from bench.gpu_model import long_examples
    from tests.tinymodel import build_tiny
    info = build_tiny(dest)
    tok = AutoTokenizer.from_pretrained(info["model"])
    config, causal_lm = (LlamaConfig, LlamaForCausalLM) if shape in LLAMA else (Qwen2Config, Qwen2ForCausalLM)
    cfg = config(**(CPU_SHAPES if cpu else SHAPES)[shape], max_position_embeddings=4096,
                 tie_word_embeddings=shape not in LLAMA, eos_token_id=tok.eos_token_id,
                 pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device("cpu" if cpu else "cuda"):
        model = causal_lm(cfg).to(torch.float32 if cpu else torch.bfloat16)
    model.save_pretrained(info["model"], safe_serialization=True)
    # The Llama rows run at cutoff 2048: their examples are longer than that, so every
    # sample fills cutoff_len (the others keep the data their rows were measured with).
    examples = long_examples(256 if cpu else 2048, words=600 if shape in LLAMA else 220)
    with open(info["dataset_file"], "w") as fh:
        json.dump(examples, fh)
    first = examples[0]
    tokens = len(tok(first["instruction"] + first["input"] + first["output"])["input_ids"])
    print(json.dumps({**info, "params": sum(p.numel() for p in model.parameters()), "example_tokens": tokens}))


def model(s: Setup, shape: str) -> dict:
    """The built model of `shape` (once per machine)."""
    dest = os.path.join(W, f"m-{shape}")
    info = os.path.join(dest, "info.json")
    if not os.path.exists(info):
        out = subprocess.run([s.python, os.path.abspath(__file__), "--build", dest, shape]
                             + (["--cpu"] if s.cpu else []), cwd=ROOT, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"building {shape} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
        with open(info, "w") as fh:
            fh.write(out.stdout.strip().splitlines()[-1])
    with open(info) as fh:
        return json.load(fh)


def job_spec(s: Setup, name: str, shape: str, batch: dict, training: dict, ft: dict, stage, steps: int,
             env: dict | None = None, cutoff: int | None = None) -> str:
    """A spec like gpu_proof's: localhost, one GPU, the built model; the memory probe on PYTHONPATH."""
    m = model(s, shape)
    probe = os.path.join(W, "probe")
    os.makedirs(probe, exist_ok=True)
    with open(os.path.join(probe, "sitecustomize.py"), "w") as fh:
        fh.write(PROBE)
    ranks = os.path.join(W, "ranks", name)
    shutil.rmtree(ranks, ignore_errors=True)
    os.makedirs(ranks)
    env = {**s.env, **EXTRA_ENV, **(env or {}), "MLAUNCH_MEMPROBE_DIR": ranks,
           "PYTHONPATH": os.pathsep.join([probe, os.environ.get("PYTHONPATH", "")])}
    job = {"name": name, "cluster": {"hosts": ["localhost"], "gpus_per_node": 1, "python": s.python, "env": env},
           "trainer": "llamafactory", "model": m["model"], "template": m["template"], "dataset": m["dataset"],
           "dataset_dir": m["dataset_dir"], "cutoff_len": cutoff or s.cutoff, "finetuning": ft, "batch": batch,
           "precision": s.precision, "output_dir": f"{W}/out-{name}",
           "training": {"learning_rate": 1.0e-4, "max_steps": steps, "logging_steps": 1, "save_steps": 10000,
                        "lr_scheduler": "constant", **training},
           "preflight": {"min_free_gb": 1, "min_shm_mb": 64}}
    if stage is not None:
        job["deepspeed"] = {"stage": stage}
    path = f"{W}/{name}.yaml"
    with open(path, "w") as fh:
        json.dump(job, fh, indent=1)   # JSON is YAML
    return path


def plan_of(path: str) -> dict:
    """`mlaunch plan --json` of a spec (the estimate that submit uses, with this machine's config)."""
    got = subprocess.run(mlaunch("plan", path, "--json", "--force"), cwd=ROOT, capture_output=True, text=True)
    return json.loads(got.stdout) if got.stdout.strip().startswith("{") else {"error": got.stderr[-500:]}


def setting_of(path: str, micro: int, ckpt: bool) -> tuple[dict, dict]:
    """(config.json, memory.Setting as a dict) of a spec: what bench/memory_fit.py reads."""
    from dataclasses import asdict

    from launcher.plan import batch as batchplan, memory
    from launcher.spec import load_spec, model_config
    job = load_spec(path)
    cfg = model_config(job.model)
    return cfg, asdict(batchplan.setting(job, memory.shape_from_config(cfg), micro, ckpt))


def one_run(s: Setup, out: str, part: str, kind: str, i: int, path: str, global_batch: int, **extra) -> dict:
    """Submit through mlaunch (preflight on, --force so a misestimate never blocks), observed."""
    name = json.load(open(path))["name"]
    # save=False: results.jsonl gets only the complete record below (the probe's allocator
    # figures included); train's own line lacked them, and was the one copied off the GPU
    rec = train(s, out, part, kind, i, mlaunch("submit", path, "--force"), f"{W}/out-{name}", global_batch,
                save=False, trace=True, **extra)
    ranks = os.path.join(W, "ranks", name)
    probe = [json.load(open(os.path.join(ranks, f))) for f in sorted(os.listdir(ranks))]
    log = open(f"{out}/{part}-{kind}-{i}.log", errors="replace").read()
    chosen = re.search(r"batch: per_device (\d+) × grad_accum (\d+), gradient checkpointing (on|off)", log)
    rec.update(max_reserved_mib=max((p["max_reserved_mib"] for p in probe), default=None),
               max_allocated_mib=max((p["max_allocated_mib"] for p in probe), default=None),
               rank_alloc_conf=[p.get("alloc_conf") for p in probe],
               alloc_stats=[p.get("stats") for p in probe],
               oom="out of memory" in log.lower(),
               batch=dict(zip(("per_device", "grad_accum", "checkpointing"),
                              (int(chosen[1]), int(chosen[2]), chosen[3] == "on"))) if chosen else None)
    rec["peak_mib"] = peak_of(rec)
    run_id = re.search(r"run (\S+):", log)
    ds = f"/tmp/mlaunch/.mlaunch/{run_id[1]}/ds_config.json" if run_id else ""
    if os.path.exists(ds) and not os.path.exists(f"{out}/ds_config-{kind}.json"):
        shutil.copy(ds, f"{out}/ds_config-{kind}.json")   # the ZeRO tuning these peaks came from
    keep(out, rec)
    return rec


def peak_of(rec: dict) -> float | None:
    """The nvidia-smi peak in MiB: a number, or the Observer's {gpu index: MiB} (the largest)."""
    peak = rec.get("peak_mib")
    return max(peak.values(), default=None) if isinstance(peak, dict) else peak


def keep(out: str, rec: dict) -> None:
    """The one record of a run: OUTDIR/results.jsonl (what bench/memory_fit.py reads) and the
    machine-local memory.jsonl that later commands (best_hand) read."""
    print(json.dumps(rec), flush=True)
    for path in (os.path.join(out, "results.jsonl"), os.path.join(W, "memory.jsonl")):
        with open(path, "a") as fh:
            fh.write(json.dumps(rec) + "\n")


def part_estimate(s: Setup, out: str, shapes: list[str], steps: int, only: list[int] | None,
                  repeat: int = 1) -> None:
    """Each chosen row of ESTIMATE once per round, `repeat` rounds (alternating, so a cut call
    still has every row); --env's cluster.env lands in the record as `env`."""
    rows = [n for n, r in enumerate(ESTIMATE) if r[0] in shapes and (only is None or n in only)]
    if only is not None:   # the order given on the command line
        rows = [n for n in only if n in rows]
    for i in range(repeat):
        for n in rows:
            shape, ft, stage, ckpt, micro, *cutoff = ESTIMATE[n]
            name = f"est{n}"
            path = job_spec(s, name, shape, {"per_device": micro, "grad_accum": 1},
                            {"gradient_checkpointing": ckpt}, ft, stage, steps,
                            cutoff=(cutoff[0] if cutoff and not s.cpu else None))
            cfg, st = setting_of(path, micro, ckpt)
            from launcher.plan import memory
            exact = memory.estimate(memory.shape_from_config(cfg), memory.Setting(**st)).total / memory.MIB
            one_run(s, out, "estimate", name, i, path, micro, name=shape, model=cfg, setting=st,
                    estimate_mib=round(exact), estimate_gib=plan_of(path).get("estimate_gib"),
                    env=EXTRA_ENV, steps=steps)


def part_sweep(s: Setup, out: str, steps: int) -> None:
    for ckpt, micro, accum in SWEEP:
        path = job_spec(s, "sweep", "0.39b", {"per_device": micro, "grad_accum": accum, "global": 64},
                        {"gradient_checkpointing": ckpt}, LORA, None, steps)
        one_run(s, out, "sweep", f"{'on' if ckpt else 'off'}-{micro}x{accum}", 0, path, 64,
                hand=[ckpt, micro, accum])


def speed_of(r: dict) -> float | None:
    """Steady-state samples/s (second logged step to the last), else the trainer's own figure."""
    return r.get("steady_samples_per_s") or r.get("samples_per_s")


def best_hand(default: str) -> tuple[bool, int, int]:
    """The fastest sweep setting recorded on this machine, else --hand."""
    path = os.path.join(W, "memory.jsonl")
    rows = [json.loads(x) for x in open(path)] if os.path.exists(path) else []
    done = [r for r in rows if r["part"] == "sweep" and r["rc"] == 0 and speed_of(r)]
    if done:
        return tuple(max(done, key=speed_of)["hand"])
    ck, micro, accum = default.split(",")
    return ck == "on", int(micro), int(accum)


def choice_kinds(hand: str) -> dict:
    """The kinds `choice` alternates: mlaunch's pick, LLaMA-Factory's habits (also under torch's
    own allocator setting, to see what mlaunch's launch environment does to them), and the best
    sweep setting recorded here or --hand; `--hand sweep` runs the whole SWEEP in every round
    instead, so the best hand setting is judged on as many runs as the pick."""
    torch_alloc = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}
    habit = ({"per_device": 8, "grad_accum": 8, "global": 64}, {"gradient_checkpointing": True})
    kinds = {"auto": ({"global": 64}, {}, {}), "lf-habit": (*habit, {}), "lf-habit-torch-alloc": (*habit, torch_alloc)}
    hands = SWEEP if hand == "sweep" else [best_hand(hand)]
    for ck, micro, accum in hands:
        label = "hand-best" if hand != "sweep" else f"hand-{'on' if ck else 'off'}-{micro}x{accum}"
        kinds[label] = ({"per_device": micro, "grad_accum": accum, "global": 64}, {"gradient_checkpointing": ck}, {})
    return kinds


def part_choice(s: Setup, out: str, runs: int, steps: int, hand: str, first: int = 0) -> None:
    """`runs` alternating rounds over choice_kinds, numbered from `first` (a later call goes on)."""
    for i in range(first, first + runs):
        for kind, (batch, training, env) in choice_kinds(hand).items():
            path = job_spec(s, f"choice-{kind}", "0.39b", batch, training, LORA, None, steps, env)
            one_run(s, out, "choice", kind, i, path, 64)


def summarize(paths: list[str]) -> str:
    rows = [json.loads(x) for p in paths for x in open(p) if x.strip()]
    rows = [{**r, "peak_mib": peak_of(r)} for r in rows]   # older files: {gpu: MiB}
    out = ["| row | run | model | method | ZeRO | ckpt | micro-batch | estimate MiB | nvidia-smi peak MiB | "
           "max_memory_reserved MiB | max_memory_allocated MiB | estimate / peak |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["part"] == "estimate"):
        st, peak, est = r["setting"], r.get("peak_mib"), r.get("estimate_mib")
        ratio = f"{est / peak:.3f}" if peak and est else "–"
        failed = "" if r["rc"] == 0 else f" (exit {r['rc']})"
        out.append(f"| {r['kind']} | {r.get('i', 0)} | {r['name']} | {st['finetuning']} | {st['zero_stage'] if st['zero_stage'] is not None else '–'} | "
                   f"{'on' if st['checkpointing'] else 'off'} | {st['micro_batch']} | {est} | {peak or '–'} | "
                   f"{round(r['max_reserved_mib']) if r.get('max_reserved_mib') else '–'} | "
                   f"{round(r['max_allocated_mib']) if r.get('max_allocated_mib') else '–'} | {ratio}"
                   f"{failed} |")
    runs = [r for r in rows if r["part"] in ("choice", "sweep")]
    if runs:
        out += ["", "| part | setting | runs | samples/s (mean) | steady samples/s (mean; else samples/s) | peak MiB | OOM |",
                "|---|---|---|---|---|---|---|"]
        means = {}
        for (part, kind) in dict.fromkeys((r["part"], r["kind"]) for r in runs):
            rs = [r for r in runs if (r["part"], r["kind"]) == (part, kind)]
            sps = [r["samples_per_s"] for r in rs if r.get("samples_per_s")]
            steady = [speed_of(r) for r in rs if speed_of(r)]
            means[(part, kind)] = sum(steady) / len(steady) if steady else None
            b = rs[-1].get("batch")
            label = kind + (f" ({b['per_device']}×{b['grad_accum']}, ckpt {'on' if b['checkpointing'] else 'off'})" if b else "")
            out.append(f"| {part} | {label} | {len(rs)} | {sum(sps) / len(sps) if sps else 0:.1f} | "
                       f"{means[(part, kind)] or 0:.1f} | {max((r.get('peak_mib') or 0) for r in rs)} | "
                       f"{sum(1 for r in rs if r.get('oom') or r['rc'])} |")
        a, h = means.get(("choice", "auto")), means.get(("choice", "lf-habit"))
        hands = {k: v for (part, k), v in means.items() if part == "choice" and k.startswith("hand-") and v}
        if a and h and hands:
            best = max(hands, key=hands.get)
            out.append(f"\nsteady samples/s: auto / LLaMA-Factory habits {a / h:.2f}× (goal ≥ 2.5×); "
                       f"auto / best hand ({best}) {a / hands[best]:.3f} (goal ≥ 0.95); "
                       f"best hand / habits {hands[best] / h:.2f}×")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?")
    ap.add_argument("--parts", default="estimate,choice")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="estimate part: which model shapes")
    ap.add_argument("--settings", help="estimate part: only these rows of ESTIMATE, e.g. 0,3,9")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=1, help="estimate part: rounds over the settings")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="cluster.env of every job, e.g. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False")
    ap.add_argument("--runs", type=int, default=3, help="choice part: runs of each kind")
    ap.add_argument("--hand", default="off,64,1",
                    help="choice part: ckpt,per_device,accum when no sweep was recorded, or 'sweep'")
    ap.add_argument("--first", type=int, default=0, help="choice part: number of the first round")
    machine_args(ap)
    ap.add_argument("--build", nargs=2, metavar=("DEST", "SHAPE"), help=argparse.SUPPRESS)
    ap.add_argument("--summarize", nargs="+")
    a = ap.parse_args()
    if a.build:
        return build(*a.build, a.cpu)
    if a.summarize:
        return print(summarize(a.summarize))
    s = prepare(a.out, a.wheels, a.cpu, work=W)
    if a.wheels:
        install_deepspeed(a.wheels)
    only = [int(x) for x in a.settings.split(",")] if a.settings else None
    EXTRA_ENV.update(kv.split("=", 1) for kv in a.env)
    parts = {"estimate": lambda: part_estimate(s, a.out, a.shapes.split(","), a.steps, only, a.repeat),
             "sweep": lambda: part_sweep(s, a.out, a.steps),
             "choice": lambda: part_choice(s, a.out, a.runs, a.steps, a.hand, a.first)}
    for name in a.parts.split(","):
        t0 = time.monotonic()
        parts[name]()
        print(f"part {name}: {time.monotonic() - t0:.0f}s", flush=True)
    table = summarize([os.path.join(a.out, "results.jsonl")])
    with open(os.path.join(a.out, "memory-proof.md"), "w") as fh:
        fh.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()

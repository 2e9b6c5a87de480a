"""Per-GPU memory of one training setting, before launch: the formula lives here, and only here.

Pure arithmetic (no torch, no I/O). Bytes throughout; `Estimate.gib` for people.
Symbols: Ψ parameters, N data-parallel GPUs, L layers, h hidden size, i MLP intermediate
size, kv = KV heads × head_dim, a attention heads, V vocabulary, s sequence length (cutoff),
b micro-batch, t = b·s tokens per micro-batch.

Model states (DeepSpeed's estimate_zero*_model_states_mem_needs, made per term):
  no DeepSpeed, full  fp32 weights 4Ψ (LLaMA-Factory upcasts trainable params) + fp32 grads
                      4Ψ + Adam 8Ψ + autocast's bf16 weight cache 2Ψ; DDP's buckets +4Ψ at N > 1
  ZeRO-0 (bf16)       2Ψ weights, 4Ψ grads, 12Ψ fp32 master+Adam = 18Ψ. DeepSpeed takes bf16
                      with the default grad_accum_dtype (bf16) to its DDP_BFLOAT16 path, the
                      unfused fp16 wrapper, not BF16_Optimizer: its fp32 grads live only inside
                      step(); 18Ψ lies between the measured rows
  ZeRO-1              2Ψ weights, 2Ψ grads, 12Ψ/N master+Adam; 6Ψ/N in step() only (as ZeRO-2,
                      the same DeepSpeed code)
  ZeRO-2              2Ψ weights, 2Ψ/N grads, 12Ψ/N master+Adam, two reduce buckets of h²
                      16-bit elements (overlap_comm; mlaunch renders reduce_bucket_size = h²);
                      a flat 16-bit copy and the fp32 grads, 6Ψ/N, in step() only. DeepSpeed's
                      stage_1_and_2 keeps the 16-bit gradient partition through backward and
                      makes the copy and its fp32 cast inside step(), after backward freed the
                      activations and logits: the peak is the larger of the two phases, so the
                      6Ψ/N counts only where it exceeds them (the `step` term)
  ZeRO-3              (2Ψ weights + 4Ψ fp32 grads + 12Ψ master+Adam)/N = 18Ψ/N, DeepSpeed's
                      own count, plus the parameters gathered at once (two of the largest layer,
                      16-bit); the 16-bit gradient partition is not counted again
  offload_optimizer   moves master, Adam and fp32 grads to the CPU; offload_param the weights
  LoRA / freeze       frozen weights in 16 bit (4-/8-bit with QLoRA: 0.55 / 1.05 bytes);
                      only trainable params (fp32 in LLaMA-Factory) carry grads and Adam: 16 B each

Activations kept for backward, per token per layer, 16-bit (Korthikanti et al. 2022,
arXiv:2205.05198, §4.1, redone for a LLaMA/Qwen decoder layer as HF transformers runs it):
  two RMSNorms        each keeps its fp32 input (4h) and its 16-bit output (2h)      12h
  attention           q after RoPE 2h, k and v repeated to all heads (repeat_kv; a padded
                      batch takes SDPA's masked path) 4h, the attention output 2h, and the
                      contiguous copy o_proj reads 2h; flash/SDPA keep no s×s scores 10h
  MLP (SwiGLU)        the normed input 2h shared by gate/up (and their LoRA A),
                      gate 2i, SiLU(gate) 2i, up 2i, their product 2i (down's input)  2h + 8i
  (no dropout: LLaMA/Qwen have none, so Korthikanti's mask bytes vanish; 34sbh becomes
   (26h + 8i)·s·b; the s² term 5as²b becomes 0, or 6·a·s per token with eager attention)
  With full recomputation (HF gradient checkpointing, one checkpoint per layer) the layers
  keep only their 16-bit inputs, 2h each, and one layer's activations live again in backward.
  Frozen layers below the first trainable one keep nothing (freeze tuning).
Logits: the loss upcasts b·s·V logits to fp32, keeps log-softmax's fp32 output, and backward
holds its fp32 and 16-bit gradients: about 12-14 bytes per vocabulary entry per token; at a
150k vocabulary this is the largest activation term. Its constant is fitted (logit_bytes).
ZeRO-3's extra term, without checkpointing only: zero3_scale × (layer activations + 12 bytes
per logit entry), what the micro-batch keeps beyond the states when the layers are not
recomputed. It rests on one measured row and is unmeasured at N > 1 and with offload.
Overhead: the CUDA context, cuBLAS workspaces, the caching allocator's slack and NCCL
buffers: a fitted constant (overhead_mib); act_scale absorbs fragmentation that grows with
the activations.

The fitted constants below are written by bench/memory_fit.py from bench/results/memory/*.jsonl
(nvidia-smi peaks on the GPU). Edit the measurements, not these numbers. What each term's form
rests on (the rows, their figures, what they ruled out): bench/results/memory/README.md.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

MIB = 2 ** 20
GIB = 2 ** 30

# BEGIN FIT (bench/memory_fit.py rewrites this block)
FIT = {
    "overhead_mib": 1463.0015,
    "act_scale": 1.0113,
    "logit_bytes": 13.3228,
    "state_scale": 1.0,
    "zero3_scale": 0.3568,
    "params": 'overhead_mib,act_scale,logit_bytes,zero3_scale',
    "source": 'bench/results/memory/h200-2026-12-01-proof.jsonl, bench/results/memory/h200-2026-12-01.jsonl, bench/results/memory/h200-2026-12-01b.jsonl, bench/results/memory/h200-2026-12-01d.jsonl, bench/results/memory/h200-2026-12-02.jsonl',
}
# END FIT

LORA_ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Shape:
    """The numbers of a decoder-only model's config.json that memory depends on."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = False
    head_dim: int | None = None
    qkv_bias: bool = True

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder layer, by HF name."""
        h, q, kv, i = self.hidden, self.heads * self.hd, self.kv_heads * self.hd, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def layer_params(self) -> int:
        """Parameters of one decoder layer: its linears, qkv biases and two norms."""
        lin = sum(a * b for a, b in self.linears().values())
        bias = (self.heads + 2 * self.kv_heads) * self.hd if self.qkv_bias else 0
        return lin + bias + 2 * self.hidden

    def embed_params(self) -> int:
        """Input embedding plus, when untied, the output head."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def params(self) -> int:
        return self.layers * self.layer_params() + self.embed_params() + self.hidden


def shape_from_config(cfg: dict | None) -> Shape | None:
    """A Shape from a HF config.json (or its text_config), or None when fields are missing."""
    if not isinstance(cfg, dict):
        return None
    c = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) and \
        "hidden_size" not in cfg else cfg
    try:
        heads = int(c["num_attention_heads"])
        return Shape(hidden=int(c["hidden_size"]), layers=int(c["num_hidden_layers"]), heads=heads,
                     kv_heads=int(c.get("num_key_value_heads") or heads),
                     intermediate=int(c["intermediate_size"]), vocab=int(c["vocab_size"]),
                     tied=bool(cfg.get("tie_word_embeddings", c.get("tie_word_embeddings", False))),
                     head_dim=int(c["head_dim"]) if c.get("head_dim") else None,
                     qkv_bias=bool(c.get("attention_bias", c.get("model_type", cfg.get("model_type")) == "qwen2")))
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Setting:
    """One way to train: method, precision, ZeRO, sequence, micro-batch, recomputation, world."""

    finetuning: str = "lora"                # lora | freeze | full
    lora_rank: int = 8
    lora_targets: tuple[str, ...] = ("all",)
    freeze_layers: int = 2                  # LLaMA-Factory's freeze_trainable_layers
    quant_bits: int | None = None           # QLoRA
    precision: str = "bf16"
    zero_stage: int | None = None           # None: no DeepSpeed
    offload_optimizer: bool = False
    offload_param: bool = False
    seq_len: int = 2048
    micro_batch: int = 1
    checkpointing: bool = True
    world: int = 1                          # data-parallel GPUs
    eager_attention: bool = False


@dataclass(frozen=True)
class Estimate:
    """Per-GPU bytes by term; total is their sum."""

    terms: tuple[tuple[str, float], ...]
    assumptions: tuple[str, ...] = field(default=())

    @property
    def total(self) -> float:
        return sum(v for _, v in self.terms)

    def gib(self) -> dict[str, float]:
        return {k: round(v / GIB, 2) for k, v in self.terms} | {"total": round(self.total / GIB, 2)}


def lora_params(shape: Shape, rank: int, targets: tuple[str, ...]) -> int:
    """A + B matrices of every targeted linear, all layers ("all": every linear but lm_head)."""
    names = set(LORA_ALL) if "all" in targets else {t.strip() for t in targets}
    per_layer = sum(rank * (a + b) for n, (a, b) in shape.linears().items() if n in names)
    return per_layer * shape.layers


def trainable_layers(shape: Shape, st: Setting) -> int:
    """Layers whose activations are kept: all, except below the first trainable one (freeze)."""
    if st.finetuning != "freeze":
        return shape.layers
    n = st.freeze_layers
    # last n trainable: nothing below them keeps activations; first |n| (n < 0): every layer does
    return shape.layers if n < 0 else min(n, shape.layers)


def states(shape: Shape, st: Setting) -> dict[str, float]:
    """weights, gradients, optimizer (and buffers) in bytes per GPU."""
    psi = shape.params()
    n = st.world
    if st.finetuning == "full":
        train, frozen = psi, 0
    elif st.finetuning == "lora":
        train, frozen = lora_params(shape, st.lora_rank, st.lora_targets), psi
    else:
        k = abs(st.freeze_layers) if st.freeze_layers else 0
        train = min(k, shape.layers) * shape.layer_params()
        frozen = psi - train
    w16 = 4 if st.precision == "fp32" else 2
    frozen_b = frozen * ({4: 0.55, 8: 1.05}.get(st.quant_bits, w16) if st.finetuning == "lora" else w16)
    z = st.zero_stage
    if z is None:       # HF Trainer / DDP: fp32 trainable params, fp32 grads, Adam, autocast copies
        w = frozen_b + train * (4 + (2 if w16 == 2 else 0))
        g = train * 4
        o = train * 8
        buf = train * 4 if n > 1 else 0
    elif z == 0:       # 18Ψ (see above)
        w, g, o, buf = frozen_b + train * w16, train * 4, train * 12, 0
    elif z in (1, 2):   # the fp32 gradient partition is step_bytes(): it lives in step() only
        w = frozen_b + train * w16
        g = train * w16 if z == 1 else train * w16 / n
        o = 0 if st.offload_optimizer else train * 12 / n
        # overlap_comm: two reduce buckets of reduce_bucket_size = h² elements (mlaunch's render)
        buf = 2 * min(train, shape.hidden ** 2) * w16 if z == 2 else 0
    else:
        largest = max(shape.layer_params(), shape.vocab * shape.hidden)
        live = 2 * largest * w16                              # gathered (prefetched) 16-bit params
        w = 0 if st.offload_param else (frozen_b + train * w16) / n
        # 18Ψ/N in all, as DeepSpeed says (above); with offload the 16-bit partition stays
        g = train * (w16 if st.offload_optimizer else 4) / n
        o = 0 if st.offload_optimizer else train * 12 / n
        buf = live
    return {"weights": w, "gradients": g, "optimizer": o, "buffers": buf}


def step_bytes(shape: Shape, st: Setting, act: float, logits: float) -> float:
    """ZeRO-1/2's optimizer step beyond the backward peak: step() flattens the 16-bit gradient
    partition into a copy (2 bytes per trainable parameter / N) and casts that to fp32 (4 more),
    less the activation and logit bytes that backward had held and freed by then (0 when
    backward peaks higher): backward's 16Ψ plus these 6Ψ, as measured (bench/results/memory)."""
    if st.zero_stage not in (1, 2) or st.offload_optimizer:
        return 0.0
    train = states(shape, st)["optimizer"] / 12
    return max(0.0, train * 6 - act - logits)


def layer_bytes(shape: Shape, st: Setting) -> float:
    """Activation bytes one decoder layer keeps per token without recomputation (see above)."""
    h, i = shape.hidden, shape.intermediate
    per = 26 * h + 8 * i
    if st.eager_attention:
        per += 6 * shape.heads * st.seq_len
    return per * (2 if st.precision == "fp32" else 1)


def activations(shape: Shape, st: Setting) -> tuple[float, float]:
    """(layer activations before act_scale, logits before logit_bytes) for one micro-batch:
    bytes, and vocabulary entries × tokens."""
    t = st.micro_batch * st.seq_len
    one = layer_bytes(shape, st)
    if st.checkpointing:
        act = trainable_layers(shape, st) * 2 * shape.hidden * (2 if st.precision == "fp32" else 1) + one
    else:
        act = trainable_layers(shape, st) * one
    return act * t, shape.vocab * t


def features(shape: Shape, st: Setting) -> dict[str, float]:
    """The estimate as a linear function of the fitted constants: bytes per unit of each.

    total = const + Σ FIT[k] · features[k]; bench/memory_fit.py solves for the FIT values.
    """
    s = states(shape, st)
    act, logit_units = activations(shape, st)
    step = step_bytes(shape, st, act * FIT["act_scale"], logit_units * FIT["logit_bytes"])
    return {"const": s["buffers"] + step, "state_scale": s["weights"] + s["gradients"] + s["optimizer"],
            "act_scale": act, "logit_bytes": logit_units, "overhead_mib": MIB,
            "zero3_scale": zero3_bytes(act, logit_units, st)}


def zero3_bytes(act: float, logit_units: float, st: Setting) -> float:
    """ZeRO-3's extra per GPU before zero3_scale: what the micro-batch keeps, when the layers
    are not recomputed (see above; with checkpointing on, the measured rows need none)."""
    return act + 12 * logit_units if st.zero_stage == 3 and not st.checkpointing else 0.0


def estimate(shape: Shape, st: Setting, fit: dict | None = None) -> Estimate:
    """Peak memory of one GPU (as nvidia-smi reports it) for training `shape` with `st`."""
    fit = fit or FIT
    k = fit["state_scale"]
    s = states(shape, st)
    act, logit_units = activations(shape, st)
    z3 = (("zero3", zero3_bytes(act, logit_units, st) * fit.get("zero3_scale", 0.0)),) \
        if st.zero_stage == 3 else ()          # a term of ZeRO-3 jobs only: other tables unchanged
    step = (("step", step_bytes(shape, st, act * fit["act_scale"], logit_units * fit["logit_bytes"])),) \
        if st.zero_stage in (1, 2) else ()
    return Estimate(terms=(("weights", s["weights"] * k), ("gradients", s["gradients"] * k),
                           ("optimizer", s["optimizer"] * k), ("buffers", s["buffers"]),
                           ("activations", act * fit["act_scale"]),
                           ("logits", logit_units * fit["logit_bytes"]), *z3, *step,
                           ("overhead", fit["overhead_mib"] * MIB)))


def lora_targets(value: str | list[str]) -> tuple[str, ...]:
    """LLaMA-Factory's lora_target (list or comma-separated) as names."""
    items = value if isinstance(value, list) else re.split(r"\s*,\s*", value)
    return tuple(x for x in (i.strip() for i in items) if x)

"""The job spec as pydantic models: field names here are the user-facing contract."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BeforeValidator, Field, PrivateAttr
from pydantic_core import PydanticCustomError


from .cluster_spec import SSH, Cluster, Container, Procs, Ray, Slurm, Strict  # noqa: F401  (re-exported)
from .cluster_spec import PathText
from .staging import CheckpointCopies, StageItem


class Finetuning(Strict):
    """LoRA, OFT, freeze or full fine-tuning, with their knobs."""

    type: Literal["lora", "oft", "freeze", "full"]
    lora_rank: int = Field(8, ge=1)
    lora_alpha: int | None = Field(None, ge=1, description=(
        "default: the trainer's (LLaMA-Factory 2 x lora_rank, ms-swift 32)"))
    lora_dropout: float | None = Field(None, ge=0, lt=1, description=(
        "default: the trainer's (LLaMA-Factory 0.0, ms-swift 0.05)"))
    lora_target: str | list[str] = "all"
    use_dora: bool = Field(False, description="weight-decomposed LoRA (DoRA)")
    use_rslora: bool = Field(False, description="rank-stabilised LoRA scaling")
    pissa_init: bool = Field(False, description="initialise the adapter with PiSSA")
    additional_target: str | list[str] | None = Field(None, description=(
        "LoRA/OFT: modules trained in full beside the adapter, e.g. embed_tokens,lm_head"))
    oft_rank: int = Field(0, ge=0, description="OFT: rank (0: use oft_block_size)")
    oft_block_size: int = Field(32, ge=1, description="OFT: block size")
    oft_target: str | list[str] = "all"
    freeze_trainable_layers: int = Field(2, description="negative counts from the bottom")
    freeze_trainable_modules: str | list[str] = "all"
    quantization_bit: int | None = Field(None, description="QLoRA/QOFT: bnb 4|8, hqq 1-6|8, eetq 8")
    quantization_method: Literal["bnb", "hqq", "eetq"] = "bnb"


Auto = Literal["auto"]
PositiveInt = Annotated[int, Field(ge=1)]
# Upper bounds of the batch sizes, far past any real job (large pre-training runs take a few
# thousand sequences per step, a few million tokens), yet low enough that a typo such as 10**20
# is refused in one line instead of planned and printed. global stays a signed 32-bit integer.
PER_DEVICE_MAX = 65536
GRAD_ACCUM_MAX = 65536
GLOBAL_MAX = 2**31 - 1


def _at_most(limit: int):
    """An AfterValidator for an `int | auto` field: an integer above limit is refused with the
    error type mlaunch_limit (explain_voice words it: the value, the limit, the fix). Outside the
    union, so the error names the field itself, not one of the union's branches."""
    def check(value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            raise PydanticCustomError("mlaunch_limit", "larger than {limit}", {"limit": limit})
        return value
    return AfterValidator(check)


class Batch(Strict):
    """Batch sizes; global must equal nodes x gpus_per_node x per_device x grad_accum.

    per_device omitted (or auto) with global given: mlaunch picks the micro-batch, the
    accumulation and gradient checkpointing from its memory estimate (launcher/plan/batch.py).
    Each size has an upper bound that no real job reaches (PER_DEVICE_MAX, GRAD_ACCUM_MAX,
    GLOBAL_MAX), so that a typo is refused rather than planned.
    """

    per_device: Annotated[PositiveInt | Auto | None, _at_most(PER_DEVICE_MAX)] = Field(None, description=(
        f"omit or auto: mlaunch chooses (needs global); at most {PER_DEVICE_MAX}, past any real job"))
    grad_accum: Annotated[PositiveInt | Auto, _at_most(GRAD_ACCUM_MAX)] = Field(1, description=(
        "omitted: global / (world x per_device) when both are given, else 1; chosen with per_device; "
        f"at most {GRAD_ACCUM_MAX}, past any real job"))
    global_: int | None = Field(None, alias="global", ge=1, le=GLOBAL_MAX, description=(
        "all processes x per_device x grad_accum; the limit (2^31 - 1) is past any real job"))
    memory_margin: float = Field(0.1, ge=0, lt=1, description=(
        "fraction of each GPU's memory the estimate must leave free"))


SWIFT_DS_NAMES = ("zero0", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload")


class DeepSpeed(Strict):
    """ZeRO: a stage with optional tuning, or the user's own ds_config.json (launcher/spec/deepspeed.py).

    Offload is optional at every stage; see DeepSpeed's docs. Tuning fields left out follow
    transformers' "auto" rules (buckets sized from the model's hidden size) or mlaunch's defaults.
    """

    stage: Literal[0, 1, 2, 3] | None = None
    config: PathText | None = Field(None, description=(
        "your ds_config.json: every \"auto\" resolved, batch checked against the spec, tuning kept"))
    name: Literal[SWIFT_DS_NAMES] | None = Field(None, description=(  # type: ignore[valid-type]
        "ms-swift's config name (zero2, zero3_offload, ...); `deepspeed: zero3` is the short form"))
    offload_optimizer: Literal["none", "cpu", "nvme"] = "none"
    offload_param: Literal["none", "cpu", "nvme"] = "none"
    nvme_path: PathText | None = None
    overlap_comm: bool | None = None
    contiguous_gradients: bool | None = None
    reduce_bucket_size: int | None = Field(None, ge=1, description="default: hidden_size²")
    allgather_bucket_size: int | None = Field(None, ge=1)
    stage3_prefetch_bucket_size: int | None = Field(None, ge=0, description="default: 0.9 × hidden_size²")
    stage3_param_persistence_threshold: int | None = Field(None, ge=0, description="default: 10 × hidden_size")
    stage3_max_live_parameters: int | None = Field(None, ge=0)
    stage3_max_reuse_distance: int | None = Field(None, ge=0)
    sub_group_size: int | None = Field(None, ge=1)
    zero3_init_flag: bool | None = Field(None, description=(
        "ZeRO-3 builds the model under deepspeed.zero.Init (always, with the HF Trainer)"))


def _deepspeed_name(value: Any) -> Any:
    """ms-swift's `--deepspeed zero3` form: a bare name stands for {name: zero3}."""
    return {"name": value} if isinstance(value, str) else value


class Training(Strict):
    """Optimiser and schedule; give epochs or max_steps."""

    learning_rate: float = Field(gt=0)
    epochs: float | None = Field(None, gt=0)
    max_steps: int | None = Field(None, ge=1)
    lr_scheduler: Literal[
        "linear", "cosine", "cosine_with_restarts", "polynomial", "constant",
        "constant_with_warmup", "inverse_sqrt", "cosine_with_min_lr", "warmup_stable_decay",
    ] = "cosine"
    warmup_ratio: float | None = Field(None, ge=0, lt=1)
    warmup_steps: int | None = Field(None, ge=0)
    save_steps: int = Field(500, ge=1)
    logging_steps: int = Field(10, ge=1, description="default: the trainer's (10 for "
                               "LLaMA-Factory, ms-swift 5)")
    max_grad_norm: float = Field(1.0, ge=0)
    gradient_checkpointing: bool | Auto = Field(True, description=(
        "auto, or omitted while mlaunch chooses per_device: chosen from the memory estimate"))
    seed: int = 42
    ddp_timeout: int | None = Field(None, ge=1, description=(
        "seconds a collective may wait for a peer before the job fails; default for LLaMA-Factory "
        "max(7200, health.startup_after_s + 600), so rank 0's preprocessing fits; ms-swift's own "
        "default (18000000) when not given"))


class Fsdp(Strict):
    """PyTorch FSDP through the HF Trainer (`fsdp` / `fsdp_config`): the third strategy."""

    sharding: Literal["full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2",
                      "no_shard"] = "full_shard"
    auto_wrap: bool = Field(True, description="wrap each decoder layer (transformer_based_wrap)")
    offload: bool = Field(False, description="parameters and gradients on the CPU")
    layer_cls: list[str] | None = Field(None, description=(
        "decoder layer classes to wrap; default: the model's _no_split_modules"))
    backward_prefetch: Literal["backward_pre", "backward_post", "no_prefetch"] | None = Field(None, description=(
        "fsdp_config backward_prefetch: fetch the next layer's weights during backward "
        "(LLaMA-Factory's FSDP examples: backward_pre); not given: not rendered, the Trainer's default"))
    cpu_ram_efficient_loading: bool | None = Field(None, description=(
        "fsdp_config cpu_ram_efficient_loading: only rank 0 loads the weights into CPU memory "
        "(LLaMA-Factory's FSDP examples: true); not given: not rendered, the Trainer's default"))


class Preference(Strict):
    """DPO / KTO knobs (LLaMA-Factory's pref_* and ref_model keys)."""

    beta: float = Field(0.1, gt=0, description="pref_beta")
    loss: Literal["sigmoid", "hinge", "ipo", "kto_pair", "orpo", "simpo"] = Field(
        "sigmoid", description="DPO only: pref_loss")
    ftx: float = Field(0.0, ge=0, description="pref_ftx: SFT loss weight")
    label_smoothing: float = Field(0.0, ge=0, le=0.5, description="DPO sigmoid only")
    simpo_gamma: float = Field(0.5, description="simpo only")
    kto_chosen_weight: float = Field(1.0, gt=0)
    kto_rejected_weight: float = Field(1.0, gt=0)
    ref_model: str | None = Field(None, description="default: the policy's own base")
    ref_model_adapters: str | None = None
    ref_model_quantization_bit: Literal[4, 8] | None = None


def _number_args(value: Any) -> Any:
    """YAML numbers in script.args (`[--epochs, 3]`) pass as their text, as written (`010`
    stays 010, not YAML 1.1's octal 8: spec/inputs.py WrittenInt); booleans do not, since
    yes/on/true all read as one value (explain.py asks to quote them)."""
    if not isinstance(value, list):
        return value
    return [getattr(v, "text", None) or str(v) if isinstance(v, (int, float)) and not isinstance(v, bool)
            else v for v in value]


class Script(Strict):
    """Any Python script or module, started by torchrun on every node."""

    path: PathText | None = None
    module: str | None = None
    args: Annotated[list[str], BeforeValidator(_number_args)] = Field(default_factory=list, description=(
        "the script's arguments; YAML numbers pass as written (3 -> \"3\", 010 -> \"010\"), booleans must be quoted"))


class Preflight(Strict):
    """Thresholds of `mlaunch check` (and of the fast checks before `submit`)."""

    min_free_gb: float = Field(10.0, ge=0, description="free space needed under output_dir")
    max_clock_offset_ms: float = Field(50.0, gt=0)
    min_shm_mb: int = Field(1024, ge=0, description="/dev/shm size; Docker's 64 MB causes Bus errors")
    check_timeout_s: float = Field(30.0, gt=0, description="per check and node")
    collective_timeout_s: float = Field(180.0, gt=0)
    collective_mb: int = Field(64, ge=1, le=8192, description="all-reduce size for the bandwidth figure")
    expect_transport: Literal["ib", "roce", "socket", "any"] = Field("any", description=(
        "the network the all-reduce must use (NCCL's choice; gloo counts as socket); else ✗"))


class Health(Strict):
    """Run health: the hang watchdog, the NaN stop and the world-size check (on by default)."""

    enabled: bool = True
    hang_after_s: float | None = Field(None, ge=10, description=(
        "no new step for this long after the first step is a hang; default "
        "max(600 s, 20 x the median step time)"))
    startup_after_s: float = Field(3600.0, ge=10, description=(
        "limit before the first step (model loading, rank 0's data preprocessing)"))
    nan_patience: int = Field(3, ge=1, description="NaN/inf loss or grad_norm logs in a row that stop the run")
    zero_loss_patience: int = Field(0, ge=0, description="stop after this many logs of loss 0.0 in a row; 0: off")
    world_size_check: bool = True
    stack_dumps: bool = Field(True, description="py-spy dump of every rank on a hang")
    log_every: int = Field(10, ge=1, description="a step event in events.jsonl every N logged steps")
    sample_every_s: float = Field(2.0, ge=0, le=3600, description=(
        "GPU (or CPU) figures of every node, over its open session, for the live view, "
        "`mlaunch ps RUN` and a gpu_sample event a minute; 0: off"))


class JobBase(Strict):
    """Fields every trainer shares."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    cluster: Cluster
    output_dir: PathText | None = None
    max_restarts: int = Field(0, ge=0, le=100)
    restart_backoff_s: float = Field(5.0, ge=0, le=3600)
    preflight: Preflight = Preflight()
    health: Health = Health()
    staging: list[StageItem] = Field(default_factory=list, description=(
        "what every node needs on its own disk (model, data, code), copied once before any node "
        "starts, node to node, hash-checked: [{src, dst, what}]"))
    checkpoints: CheckpointCopies | None = Field(None, description=(
        "{replicas: N}: each node's part of every complete checkpoint copied to N other nodes "
        "(hosts without a shared disk); resume, spares and shrink find it there"))
    # What loading read past or selected (hostfile keys, include/exclude), for the dry run.
    _notes: tuple[str, ...] = PrivateAttr(default=())
    # cluster.env names whose value came from `${NAME}`: secrets whatever their names.
    _secret_env: frozenset[str] = PrivateAttr(default=frozenset())
    # The spec keys that KEY=VALUE overrides on the command line set (dotted, the spec's names).
    _overridden: tuple[str, ...] = PrivateAttr(default=())


class LlamaFactoryJob(JobBase):
    """A LLaMA-Factory fine-tuning job."""

    trainer: Literal["llamafactory"]
    stage: Literal["sft", "pt", "dpo", "kto", "rm"] = "sft"
    model: PathText
    template: str | None = Field(None, description="required except for stage pt")
    dataset: str | list[str]
    dataset_dir: PathText | None = None
    cutoff_len: int = Field(2048, ge=1)
    tokenize_once: str | None = Field(None, description=(
        "an absolute path on every node: the dataset is tokenized there once, on node 0, before "
        "any rank starts, then staged to the other nodes (LLaMA-Factory's tokenized_path)"))
    finetuning: Finetuning
    batch: Batch
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    deepspeed: DeepSpeed | None = None
    fsdp: Fsdp | None = None
    preference: Preference | None = Field(None, description="stage dpo or kto")
    training: Training
    report_to: Literal["none", "tensorboard", "wandb", "mlflow", "swanlab"] = Field(
        "none", description="experiment tracker; rank 0 reports, run name = run id")
    output_dir: PathText
    passthrough: dict[str, Any] = Field(default_factory=dict)

    def effective_preference(self) -> Preference | None:
        """The preference settings the run uses: the spec's, else the defaults for dpo/kto."""
        return self.preference or (Preference() if self.stage in ("dpo", "kto") else None)


class Megatron(Strict):
    """Megatron-SWIFT parallelism; world = tp x pp x cp x data-parallel size."""

    tp: int = Field(1, ge=1, description="tensor parallel size (--tensor_model_parallel_size)")
    pp: int = Field(1, ge=1, description="pipeline parallel size (--pipeline_model_parallel_size)")
    cp: int = Field(1, ge=1, description="context parallel size (--context_parallel_size): each "
                    "sequence split across cp ranks; dp = world / (tp x pp x cp)")
    ep: int = Field(1, ge=1, description="expert parallel size (--expert_model_parallel_size), MoE "
                    "models; ep x etp x pp must divide the world")
    etp: int = Field(1, ge=1, description="expert tensor parallel size (--expert_tensor_parallel_size)")
    sequence_parallel: bool = Field(False, description=(
        "split activations across the tp group; with tp 1 ms-swift turns it off"))
    recompute: Literal["selective", "full", "none"] | None = Field(None, description=(
        "--recompute_granularity; default selective (Megatron-SWIFT's), or full / none when "
        "training.gradient_checkpointing is given"))


# ms-swift 4.6's rlhf_type values (swift/arguments/rlhf_args.py); Megatron-SWIFT takes fewer.
RLHF_TYPES = ("dpo", "orpo", "simpo", "kto", "cpo", "rm", "ppo", "grpo", "gkd")
MEGATRON_RLHF_TYPES = ("dpo", "kto", "grpo", "gkd", "rm")


class SwiftJob(JobBase):
    """An ms-swift (4.x) job; with `megatron:` it runs Megatron-SWIFT instead of HF Trainer.

    Fields left out train as ms-swift's own CLI would (launcher/plan/defaults.py)."""

    trainer: Literal["swift"]
    stage: Literal["sft", "pt", "rlhf"] = Field("sft", description="swift sft | pt | rlhf "
                                                "(megatron sft | pt | rlhf with a megatron section)")
    rlhf_type: Literal[RLHF_TYPES] | None = Field(None, description="with stage rlhf: dpo, kto, grpo, "
                                                  "gkd, rm, orpo, simpo, cpo, ppo")
    model: PathText
    model_type: str | None = Field(None, description="ms-swift model type; inferred from the model when omitted")
    template: str | None = Field(None, description="ms-swift template; the model type's default when omitted")
    dataset: str | list[str]
    max_length: int | None = Field(None, ge=1, description="tokens per sample (LLaMA-Factory's "
                                   "cutoff_len); default: the model's maximum, as ms-swift")
    finetuning: Finetuning
    batch: Batch
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    deepspeed: Annotated[DeepSpeed | None, BeforeValidator(
        _deepspeed_name, json_schema_input_type=DeepSpeed | Literal[SWIFT_DS_NAMES] | None)] = None
    megatron: Megatron | None = None
    training: Training
    output_dir: PathText
    passthrough: dict[str, Any] = Field(default_factory=dict)


class ScriptJob(JobBase):
    """A plain torchrun job: the same cluster block, any script."""

    trainer: Literal["script"]
    script: Script


# The trainer seam: a new trainer adds its model here and a Trainer in launcher/trainers.
Job = Annotated[Union[LlamaFactoryJob, SwiftJob, ScriptJob], Field(discriminator="trainer")]
TRAINER_MODELS: dict[str, type[JobBase]] = {"llamafactory": LlamaFactoryJob, "swift": SwiftJob,
                                            "script": ScriptJob}

"""ms-swift 4.6's own DeepSpeed files (swift/config/<name>.json), for `deepspeed: zero3` and
the other names: the zero_optimization block each states, "auto" where ms-swift leaves the
number to transformers (launcher/spec/deepspeed.py resolves those).
"""
AUTO = "auto"   # the value DeepSpeed files leave to transformers (deepspeed.py resolves it)

_ZERO_COMMON = {"allgather_partitions": True, "allgather_bucket_size": 200000000, "overlap_comm": False,
                "reduce_scatter": True, "reduce_bucket_size": 200000000, "contiguous_gradients": True}
_ZERO3 = {"stage": 3, "overlap_comm": False, "contiguous_gradients": True, "sub_group_size": 1000000000,
          "reduce_bucket_size": AUTO, "zero_quantized_weights": False, "zero_quantized_gradients": False,
          "stage3_prefetch_bucket_size": AUTO, "stage3_param_persistence_threshold": AUTO,
          "stage3_max_live_parameters": 1000000000, "stage3_max_reuse_distance": 1000000000,
          "stage3_gather_16bit_weights_on_model_save": True}
_OFF = {"device": "none", "pin_memory": True}
_CPU = {"device": "cpu", "pin_memory": True}
# The zero_optimization of each file (its other keys are "auto"
# batch/clipping/precision, which the spec sets, and steps_per_print / wall_clock_breakdown).
SWIFT_ZERO = {
    "zero0": {"stage": 0, **_ZERO_COMMON},
    "zero1": {"stage": 1, "offload_optimizer": _OFF, **_ZERO_COMMON},
    "zero2": {"stage": 2, "offload_optimizer": _OFF, **_ZERO_COMMON},
    "zero2_offload": {"stage": 2, "offload_optimizer": _CPU, **_ZERO_COMMON},
    "zero3": {**_ZERO3, "offload_optimizer": _OFF, "offload_param": _OFF},
    "zero3_offload": {**_ZERO3, "offload_optimizer": _CPU, "offload_param": _CPU},
}

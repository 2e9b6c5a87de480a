"""The job spec: models, loading and validation rules."""
from .load import SECRET_NAME, load_spec, parse_hostfile, parse_spec, validate
from .models import (SSH, Batch, Cluster, DeepSpeed, Finetuning, Job, JobBase, Megatron, Preflight,
                     LlamaFactoryJob, Script, ScriptJob, SwiftJob, Training, TRAINER_MODELS)
from .rules import LLAMAFACTORY_OWNED, world_size, world_text
from .select import node_procs
from .swift_rules import SWIFT_OWNED, model_config

__all__ = ["SECRET_NAME", "load_spec", "parse_hostfile", "parse_spec", "validate", "SSH", "Batch",
           "Cluster", "DeepSpeed", "Finetuning", "Job", "JobBase", "Megatron", "Preflight", "LlamaFactoryJob",
           "Script", "ScriptJob", "SwiftJob", "Training", "TRAINER_MODELS", "LLAMAFACTORY_OWNED",
           "SWIFT_OWNED", "model_config", "node_procs", "world_size", "world_text"]

"""The job spec: the pydantic models, loading (YAML, hostfiles, ${NAME} references) and the
rules between fields, each with the field, the value and the fix.

Holds models and cluster_spec (the schema), load (parse, validate, one line per problem),
explain and explain_voice (pydantic's errors in mlaunch's words), check (the rules' one entry point), rules,
cluster_rules, slurm_rules, secret_rules, ds_rules, deepspeed, lf_rules, lf_optim_rules,
swift_rules, megatron_rules (each trainer's and section's rules), hosts and select (hosts,
hostfiles, node selection, world size), overrides (KEY=VALUE from the command line),
model_config, known_args, swift_zero.

May import: errors, render (the default DeepSpeed config's template) and nodeprog.
"""
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

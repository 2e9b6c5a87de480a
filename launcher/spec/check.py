"""The one entry point of the cross-field rules: the rules every job shares (rules.py), then
its trainer's own (lf_rules.py, swift_rules.py). Above them all, so none imports another back."""
from __future__ import annotations

from ..errors import Problem
from .lf_rules import check_llamafactory
from .models import JobBase, LlamaFactoryJob, ScriptJob
from .secret_rules import check_batch_secrets, check_secret_refs, check_setup_secrets
from .rules import (check_batch, check_cluster, check_dataset, check_deepspeed, check_finetuning,
                    check_output_dir, check_passthrough, check_script, check_training)
from .spare_rules import check_shrink
from .staging import check_checkpoints, check_staging, check_tokenize_once
from .swift_rules import check_swift


def check_job(job: JobBase) -> list[Problem]:
    """All cross-field problems of a validated job, in field order."""
    problems = check_cluster(job.cluster) + check_output_dir(job) + check_dataset(job)
    problems += check_batch_secrets(job) + check_secret_refs(job) + check_setup_secrets(job.cluster.setup)
    problems += check_shrink(job)
    problems += check_staging(job) + check_tokenize_once(job) + check_checkpoints(job)
    if isinstance(job, LlamaFactoryJob):
        problems += check_batch(job) + check_finetuning(job) + check_deepspeed(job)
        problems += check_training(job) + check_passthrough(job)
        problems += check_llamafactory(job)
    elif isinstance(job, ScriptJob):
        problems += check_script(job)
    else:
        problems += check_swift(job)
    return problems

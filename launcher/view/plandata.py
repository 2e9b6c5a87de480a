"""A plan as data: what `submit --dry-run --json` prints and what the registry records for
the run and each attempt, in one form, so that the two can be compared field by field."""
from __future__ import annotations

from ..plan.launch_plan import MASK, LaunchPlan
from ..spec.secret_rules import mask_data
from ..spec.spare_rules import shrinks
from . import memview
from .dryrun import user_env


def plan_data(plan: LaunchPlan, backend: str, resume: str | None = None) -> dict:
    """The nodes (argv, environment beyond mlaunch's own, secrets masked), the files, the
    batch decision, the restart policy and the notes, and `preflight_decides`: the keys whose
    values submit's preflight may still change (preflight_decides_keys). Every string goes
    through mask_data, as the dry-run's text does: no field can print a secret the text
    would mask."""
    job = plan.job
    return mask_data({
        "job": job.name, "run_id": plan.run_id, "attempt": plan.attempt, "tag": plan.tag,
        "backend": backend, "trainer": job.trainer, "notes": list(job._notes),
        "restarts": {"max_restarts": job.max_restarts, "backoff_s": job.restart_backoff_s,
                     **({"spare_hosts": list(job.cluster.spare_hosts)} if job.cluster.spare_hosts else {}),
                     **({"min_nodes": job.cluster.min_nodes} if shrinks(job.cluster) else {})},
        "preflight_decides": preflight_decides(plan),
        "resume": plan.resume_from or resume,
        "log_dir": plan.log_dir, "run_dir": plan.run_dir,
        "ssh": job.cluster.ssh.model_dump(mode="json"),
        "batch": memview.to_dict(plan.batch) if plan.batch else None,
        "nodes": [{"rank": n.rank, "host": n.host, "login": n.login, "argv": list(n.argv),
                   "env": dict(user_env(n)), "workdir": n.workdir, "pidfile": n.pidfile,
                   "log": n.log_path, **_container(n)} for n in plan.nodes],
        "files": [{"path": f.path, "note": f.note or None} for f in plan.files],
    }, plan.secrets, MASK)


def _container(n) -> dict:
    """A node's runtime line and the text that removes its container (cluster.container):
    `stop` removes it from what the registry recorded."""
    return {"container": n.container, "container_rm": n.container_rm} if n.container else {}


def preflight_decides(plan: LaunchPlan) -> list[str]:
    """The keys of plan_data that submit's preflight may still change: the batch numbers
    mlaunch picks (from the nodes' GPU memory) and, with them, the argv and files that carry
    them; the warmup argument's form (from the nodes' transformers) in the same places."""
    chosen = bool(plan.batch and plan.batch.chosen)
    warmup = getattr(getattr(plan.job, "training", None), "warmup_ratio", None) is not None or \
        getattr(getattr(plan.job, "training", None), "warmup_steps", None) is not None
    keys = (["batch"] if chosen else []) + (["nodes.argv", "files"] if chosen or warmup else [])
    return keys

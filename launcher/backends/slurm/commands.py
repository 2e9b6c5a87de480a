"""Running one attempt as a Slurm batch job: sbatch, follow the per-node logs, scancel.

The scheduler's commands (slurm_executor.py holds the executor). submit's flow stays what it is (output_dir guard, lock,
attempts and restarts): the short helpers it runs "on node 0" (checkpoint discovery, the
output_dir lock) run here on the login node, which sees output_dir on shared storage; an
attempt is one `sbatch --parsable` job whose state comes from `scontrol show job` (no
sacct: accounting may not exist). Imports at module level are standard library only.
"""
from __future__ import annotations

import os
import re
import subprocess
import time

from ...errors import UserError
from ...transport.base import LOST, Exit

POLL_S = 0.25          # how often the job's state and its log files are read
GONE_WAIT_S = 180.0    # how long a cancel waits for the job to leave every node
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
          "RESIZING", "SIGNALING", "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD")
NEVER_EXIT = 2         # a job Slurm can never start: the request is the user's to fix
NO_ANSWER = 124        # slurm_cmd's exit code when the command did not answer in time
UNANSWERED = "UNANSWERED"   # job_info's JobState when scontrol could not be asked
# Pending reasons that no wait can clear: the request exceeds what the partition, its nodes,
# the account or the QOS allow (squeue's REASON; `scontrol show job`'s Reason=).
NEVER_STARTS = {
    "PartitionConfig": "the request (nodes, cpus-per-task, mem, gres, time) exceeds what the "
                       "partition or its nodes have",
    "BadConstraints": "no node has the requested constraint/features and resources",
    "PartitionNodeLimit": "more nodes than the partition allows",
    "PartitionTimeLimit": "a time limit above the partition's",
    "InvalidAccount": "the account is not valid", "InvalidQOS": "the QOS is not valid",
    "AccountNotAllowed": "the partition does not take this account",
    "QOSNotAllowed": "the partition does not take this QOS",
    "DependencyNeverSatisfied": "a dependency that can never be met",
}
SRUN_EXIT = re.compile(r"srun: error: (\S+): task (\d+): (Exited with exit code (\d+)|\w+)")

# sbatch's refusals, and the spec field that fixes each.
SBATCH_FIELDS = (("partition", "cluster.slurm.partition"), ("account", "cluster.slurm.account"),
                 ("qos", "cluster.slurm.qos"), ("time", "cluster.slurm.time"),
                 ("reservation", "cluster.slurm.reservation"),
                 ("constraint", "cluster.slurm.constraint"), ("feature", "cluster.slurm.constraint"),
                 ("node count", "cluster.slurm.nodes"), ("nodes", "cluster.slurm.nodes"))


# What a client needs to run at all: kept even where a spec read a `${NAME}` from one of them
ESSENTIAL = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TZ", "TMPDIR",
                       "SLURM_CONF", "LD_LIBRARY_PATH"})


def client_env() -> dict[str, str]:
    """This environment less every secret-named variable (HF_TOKEN, WANDB_API_KEY, ...) and
    every variable a spec's `${NAME}` value was read from (spec/secret_rules.py REF_SOURCES):
    sbatch, salloc and srun export the whole environment into the job by default, where
    slurmctld stores it (and slurmdbd, with AccountingStoreFlags=job_env, for `sacct
    --env-vars`). A secret the nodes need is named in cluster.env, which reaches them in a
    0600 file (templates/secrets_env.sh.j2), never through Slurm."""
    from ...spec import SECRET_NAME
    from ...spec.secret_rules import REF_SOURCES
    refs = REF_SOURCES - ESSENTIAL
    return {k: v for k, v in os.environ.items() if not SECRET_NAME.search(k) and k not in refs}



def slurm_cmd(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    """A Slurm client command (SLURM_CONF and PATH from this environment). Never raises: a
    missing binary is exit 127 and no answer within timeout exit 124 (NO_ANSWER), each with
    a stderr line saying so, so that every caller handles it as the command failing."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, env=client_env())
    except OSError as e:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: {e.strerror or e}")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, NO_ANSWER, "", f"{argv[0]}: no answer in "
                                           f"{timeout:g} s (is slurmctld up?)")


def job_info(job_id: str) -> dict[str, str]:
    """`scontrol show job -o` as a dict; {} once Slurm has forgotten the job; JobState
    UNANSWERED when scontrol cannot tell (the job may still be running)."""
    r = slurm_cmd(["scontrol", "show", "job", "-o", job_id])
    if r.returncode in (NO_ANSWER, 127):
        return {"JobState": UNANSWERED, "Reason": r.stderr.strip()}
    if r.returncode != 0:
        return {}
    return dict(re.findall(r"(\w+)=(\S*)", r.stdout))


def is_gone(info: dict[str, str]) -> bool:
    """The job has ended on every node (COMPLETING, and a controller that did not answer,
    count as still there: a blip of slurmctld must not end or orphan a run)."""
    return not info or info.get("JobState") not in (*ACTIVE, UNANSWERED)


def cancel_and_wait(job_id: str, kill: bool = False, timeout: float = GONE_WAIT_S) -> bool:
    """scancel (SIGKILL at once with kill), then wait until the job has left every node."""
    slurm_cmd(["scancel", *(["--signal=KILL", "--full"] if kill else []), job_id])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if is_gone(job_info(job_id)):
            return True
        time.sleep(0.1)
    return False


def never_starts(info: dict[str, str]) -> str | None:
    """One line on why a pending job can never start, from Slurm's own reason; None while it
    may still start."""
    reason = info.get("Reason", "")
    if info.get("JobState") != "PENDING" or reason not in NEVER_STARTS:
        return None
    return (f"Slurm's reason {reason}: {NEVER_STARTS[reason]} (partition "
            f"{info.get('Partition', '?')}: {info.get('NumNodes', '?')} nodes, "
            f"{info.get('NumCPUs', '?')} CPUs requested)")


def hostnames(nodelist: str) -> list[str]:
    r = slurm_cmd(["scontrol", "show", "hostnames", nodelist])
    return r.stdout.split() if r.returncode == 0 else []


def sbatch_error(stderr: str) -> UserError:
    """sbatch's refusal as one line naming the spec field that fixes it."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    msg = next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else "no output")
    low = msg.lower()
    field = next((f for word, f in SBATCH_FIELDS if word in low), "cluster.slurm")
    return UserError(f"{field}: sbatch refused the job: {msg}; fix {field} (nothing was queued)")


def node_outcomes(batch_lines: list[str], state: str):
    """Each node's Exit from srun's messages in the batch log ("task K: Exited with exit
    code N", "task K: Killed"); (outcomes, first failing rank)."""
    exits: dict[int, Exit] = {}
    first = None
    for line in batch_lines:
        m = SRUN_EXIT.search(line)
        if not m:
            continue
        rank = int(m.group(2))
        if m.group(4) is not None:
            exits.setdefault(rank, Exit(int(m.group(4))))
            if first is None and int(m.group(4)) != 0:
                first = rank
        else:
            exits.setdefault(rank, Exit(LOST if state == "NODE_FAIL" else 143, detail=m.group(3)))
    return exits, first



# `scontrol show node`'s State words of a node Slurm will not (or should not) run on again.
FAILED_STATES = ("DRAIN", "DOWN", "FAIL", "NOT_RESPONDING")


def failed_nodes(names: list[str]) -> dict[str, str]:
    """{node: why} of the named nodes Slurm reports drained, down or failing (State=IDLE+DRAIN,
    DOWN*, MIXED+DRAIN, FAIL...), with Slurm's Reason; a node it no longer knows is left out."""
    bad: dict[str, str] = {}
    for name in dict.fromkeys(names):
        r = slurm_cmd(["scontrol", "show", "node", "-o", name])
        info = dict(re.findall(r"(\w+)=(\S*)", r.stdout)) if r.returncode == 0 else {}
        words = re.split(r"[+*]", info.get("State", ""))
        hit = [w for w in words if any(w.startswith(s) for s in FAILED_STATES)]
        if hit:
            reason = re.search(r"Reason=(.*?)(?: \[|$)", r.stdout.strip())
            bad[name] = f"Slurm state {info['State']}" + (f": {reason.group(1)}" if reason else "")
    return bad


def usable_nodes(partition: str | None, exclude: list[str]) -> tuple[str, list[str]] | None:
    """(partition, its nodes a job could still get): every node of the partition (the default
    one when None) that is not in `exclude` and that sinfo shows neither drained, down,
    failing nor unresponsive. None when sinfo cannot tell (then nothing is changed)."""
    r = slurm_cmd(["sinfo", "-h", "-N", "-o", "%N|%P|%T"])
    if r.returncode != 0:   # no sinfo here, slurmctld not answering, or an error
        return None
    rows = [ln.split("|") for ln in r.stdout.splitlines() if ln.count("|") == 2]
    part = partition or next((p.rstrip("*") for _, p, _ in rows if p.endswith("*")), None)
    if part is None:
        return None
    skip = set(exclude)
    nodes = {n for n, p, state in rows if p.rstrip("*") == part and n not in skip
             and not _unusable(state)}
    return part, sorted(nodes)


def _unusable(state: str) -> bool:
    """sinfo's long state (%T) of a node Slurm will not start a job on: drained/draining,
    down, fail/failing, inval, future, or a trailing * (not responding)."""
    base = state.lower().rstrip("~#!%$@^-")
    return base.endswith("*") or base.startswith(("drain", "down", "fail", "inval", "future"))

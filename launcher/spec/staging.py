"""`staging:`: what every node needs on its own disk (the model, the data, the code), where it
comes from and where it goes (issue 54). Copied once to every node before any node starts,
node to node, hash-checked (launcher/transport/staging.py does the copying; this module only
says what the user wrote and what is wrong with it)."""
from __future__ import annotations

import os
import posixpath
from typing import Literal

from pydantic import Field

from ..errors import Problem
from .cluster_spec import Strict

NODE = "node:"   # a src held by a node of the run, not by this machine


class StageItem(Strict):
    """One thing every node needs locally."""

    src: str = Field(description=(
        "a directory or file on this machine (relative: beside the spec), or node:PATH, a path "
        "on a node of the run that has it"))
    dst: str = Field(description="the absolute path on every node")
    what: Literal["files", "code"] = Field("files", description=(
        "files: everything under src; code: what `git ls-files` lists in src (a git work tree)"))

    @property
    def on_node(self) -> bool:
        """Whether a node, not this machine, holds the source."""
        return self.src.startswith(NODE)

    @property
    def path(self) -> str:
        """The source path (on this machine, or on the node for node:PATH)."""
        return self.src[len(NODE):] if self.on_node else self.src


class CheckpointCopies(Strict):
    """checkpoints: each node's part of every complete checkpoint kept on other nodes too, for
    hosts that share no disk (launcher/transport/replicas.py)."""

    replicas: int = Field(1, ge=1, le=16, description=(
        "how many other nodes get a copy of each node's part of every complete checkpoint"))
    poll_s: float = Field(2.0, gt=0, le=600, description="how often the nodes are asked for new checkpoints")


def check_checkpoints(job) -> list[Problem]:
    """checkpoints.replicas: fewer than the nodes, an output_dir, LLaMA-Factory's layout."""
    if job.checkpoints is None:
        return []
    nodes = len(job.cluster.hosts or [])
    out = _ssh_only(job, "checkpoints")
    if job.trainer != "llamafactory":
        out.append(Problem("checkpoints", f"replication reads LLaMA-Factory's checkpoint-N layout; "
                           f"trainer {job.trainer} is not covered yet: remove checkpoints:"))
    if nodes and job.checkpoints.replicas >= nodes:
        out.append(Problem("checkpoints.replicas", f"{job.checkpoints.replicas}: each part goes to other "
                           f"nodes, and there are {nodes}; give at most {nodes - 1}"))
    return out


def absolute_sources(raw: dict, base: str) -> None:
    """staging[].src given relative: made absolute against the spec's directory (base), as
    cluster.hostfile is, whatever directory mlaunch runs from."""
    items = raw.get("staging")
    if not isinstance(items, list):
        return
    for item in items:
        src = item.get("src") if isinstance(item, dict) else None
        if isinstance(src, str) and src and not src.startswith((NODE, "/")):
            item["src"] = os.path.normpath(os.path.join(base, os.path.expanduser(src)))


def _ssh_only(job, key: str) -> list[Problem]:
    """Staging and checkpoint copies run over the ssh backend's connections: under another
    scheduler, one line."""
    if job.cluster.scheduler == "ssh":
        return []
    return [Problem(key, f"needs cluster.scheduler ssh (the nodes reached over ssh before they start); "
                    f"under {job.cluster.scheduler}, stage by hand or remove {key}:")]


def check_staging(job) -> list[Problem]:
    """One line per problem: a dst that is not an absolute path below /, two items at one dst
    or one inside another, a local src that does not exist, code that is not a git work tree or
    comes from a node; another scheduler than ssh."""
    items: list[StageItem] = job.staging
    problems: list[Problem] = _ssh_only(job, "staging") if items else []
    dsts: list[tuple[int, str]] = []
    for i, item in enumerate(items):
        where = f"staging[{i}]"
        dst = posixpath.normpath(item.dst) if item.dst else ""
        if not item.dst.startswith("/") or dst == "/":
            problems.append(Problem(f"{where}.dst", f"{item.dst!r}: give an absolute path on the nodes "
                                    "below / (e.g. /nvme/models/NAME)"))
        else:
            for j, other in dsts:
                if dst == other or dst.startswith(other + "/") or other.startswith(dst + "/"):
                    problems.append(Problem(f"{where}.dst", f"{item.dst!r} overlaps staging[{j}].dst "
                                            f"{other!r}; give each item a directory of its own"))
            dsts.append((i, dst))
        problems += _source_problems(where, item)
    return problems


def check_tokenize_once(job) -> list[Problem]:
    """tokenize_once: an absolute path, and LLaMA-Factory's own tokenized_path or streaming not
    given beside it in passthrough."""
    path = getattr(job, "tokenize_once", None)
    if path is None:
        return []
    if not path.startswith("/") or posixpath.normpath(path) == "/":
        return [Problem("tokenize_once", f"{path!r}: give an absolute path on the nodes below / "
                        "(e.g. /nvme/tokenized/NAME)")]
    taken = [k for k in ("tokenized_path", "streaming") if job.passthrough.get(k)]
    boxed = [Problem("tokenize_once", "with cluster.container the tokenizing run would start on "
                     "node 0's host, not in the image (cluster.python names the image's interpreter): "
                     "remove tokenize_once, or leave it to each rank (LLaMA-Factory tokenizes on "
                     "its own)")] if job.cluster.container is not None else []
    return _ssh_only(job, "tokenize_once") + boxed + [Problem(f"passthrough.{k}", f"{job.passthrough[k]!r} beside tokenize_once: remove "
                    f"passthrough.{k} (tokenize_once sets tokenized_path and needs a dataset on disk)")
            for k in taken]


def _source_problems(where: str, item: StageItem) -> list[Problem]:
    if item.on_node:
        if not item.path.startswith("/"):
            return [Problem(f"{where}.src", f"{item.src!r}: a node's path must be absolute (node:/data/x)")]
        if item.what == "code":
            return [Problem(f"{where}.what", "code is listed by `git ls-files` on this machine; "
                            "give a src on this machine, or what: files")]
        return []
    if not os.path.exists(item.path):
        return [Problem(f"{where}.src", f"{item.src!r} does not exist on this machine; fix the "
                        f"path, or write node:{item.src} for a path a node of the run has")]
    if item.what == "code" and not os.path.isdir(os.path.join(item.path, ".git")) \
            and not os.path.isfile(os.path.join(item.path, ".git")):
        return [Problem(f"{where}.what", f"code: {item.src!r} is not the top of a git work tree; "
                        "give the work tree's top directory, or what: files")]
    return []

"""The dry-run's staging lines (issue 54): each item's source, size and destination, and how
it reaches the nodes. Reads only this machine's files (sizes; a code item's listing through
list_code, the backend's `git ls-files`); what each node already has is found at submit from
its manifest, since the dry-run contacts no node."""
from __future__ import annotations

import os

from ..plan.staging import rounds, size_text


def staging_lines(job, nodes: int, list_code=None) -> list[str]:
    """The staging plan's lines and the checkpoint replication policy, or none. list_code(top):
    a code item's files (None when git failed); without it the listing is left to submit."""
    return _items(job, nodes, list_code) + _tokenize(job) + _copies(job)


def _tokenize(job) -> list[str]:
    path = getattr(job, "tokenize_once", None)
    return [f"tokenize_once: LLaMA-Factory tokenizes the dataset once on node 0 into {path} before any "
            "rank starts (skipped when made from the same inputs), then it is staged to every node; "
            "the ranks load it (tokenized_path)"] if path else []


def _copies(job) -> list[str]:
    c = job.checkpoints
    if c is None:
        return []
    limit = getattr(job, "passthrough", {}).get("save_total_limit")
    keep = (f"save_total_limit {limit} applied on every node" if limit
            else "no retention (save_total_limit not set): every checkpoint stays on every node")
    return [f"checkpoints: each node's part of every complete checkpoint copied to the next "
            f"{c.replicas} node(s) (hash-checked, polled every {c.poll_s:g} s) into "
            f"{job.output_dir}/.mlaunch-replicas/; {keep}; a restart resumes the newest checkpoint "
            "complete across copies, put together on node 0 and staged to every node"]


def _items(job, nodes: int, list_code) -> list[str]:
    if not job.staging:
        return []
    n_rounds = len(rounds([""], [str(i) for i in range(nodes)]))
    lines = [f"staging: before any node starts, to each of the {nodes} nodes that lacks it or holds "
             f"another content, node to node ({n_rounds} rounds at most), checked against its manifest "
             "(size + sha256 per file); what is in place is read from each node's manifest at submit"]
    for i, item in enumerate(job.staging):
        lines.append(f"  staging[{i}] {item.dst} <- {item.src}: {_source(item, list_code)}")
    return lines


def _source(item, list_code) -> str:
    if item.on_node:
        return "on a node of the run (the first that has it feeds the others; sized at submit)"
    if item.what == "code" and list_code is None:
        return "code: the files git ls-files lists there, listed at submit, from this machine"
    if item.what == "code":
        names = list_code(item.path)
        if names is None:
            return "code: git ls-files failed here"
        size = sum(os.path.getsize(os.path.join(item.path, n)) for n in names)
        return f"code, {len(names)} files from git ls-files, {size_text(size)}, from this machine"
    files, size = _walk(item.path)
    return f"{size_text(size)} in {files} files, from this machine"


def _walk(path: str) -> tuple[int, int]:
    """(files, bytes) under path (path itself when a file); links not followed."""
    if not os.path.isdir(path):
        return 1, os.path.getsize(path) if os.path.exists(path) else 0
    files = size = 0
    for d, _, names in os.walk(path):
        for n in names:
            files += 1
            size += os.lstat(os.path.join(d, n)).st_size
    return files, size

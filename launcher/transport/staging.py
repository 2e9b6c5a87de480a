"""Staging (issue 54): every staged item copied once to every node that lacks it, before any
node starts, node to node (plan/staging.py's rounds), into a temporary name renamed into place
once its manifest matches the source's (nodeprog/manifest.py). rsync does the copying, over
the run's own SSH connections from this machine, and over ssh with the run's settings
(cluster.ssh: user, port, key file, known_hosts) from node to node; the commands come from
templates/staging_*.j2. Disk space is checked on every node before anything is copied.
"""
from __future__ import annotations

import hashlib
import json
import os
import posixpath
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .. import nodeprog, render
from ..errors import Problem, UserError
from ..nodeprog import manifest as mf
from ..plan.launch_plan import LaunchPlan, remote_python
from ..plan.staging import LAUNCHER, Copy, needed_bytes, rounds, size_text
from ..spec.hosts import login_addr
from ..spec.staging import StageItem
from .openssh import CIPHERS

PROBE_TIMEOUT_S = 600          # hashing a node:PATH source of many GB takes minutes
COPY_TIMEOUT_S = 24 * 3600     # one copy of one item to one node
TMP, MANIFEST = ".mlaunch-tmp", mf.SUFFIX


@dataclass
class Item:
    """One staged item as found: its source's manifest, its holder, each node's state."""

    index: int
    spec: StageItem
    source: dict | None = None                 # the source's manifest
    holder: str = LAUNCHER                      # LAUNCHER, or the login of the node with node:PATH
    names: list[str] | None = None              # code: the files git lists
    nodes: dict[str, dict] = field(default_factory=dict)   # login -> its probe of this item

    label: str = ""                             # how its line names it (default: staging[i])

    @property
    def where(self) -> str:
        return f"{self.label or f'staging[{self.index}]'} {self.spec.dst}"

    def lacking(self) -> list[str]:
        """The nodes whose copy is absent, changed, or another content than the source's."""
        return [h for h, p in self.nodes.items()
                if p["state"] != "current" or p["digest"] != self.source["digest"]]


def stage(plan: LaunchPlan, executor, say) -> dict[str, str]:
    """Every item of plan.job.staging on every node of plan, current; one line per item (say);
    {dst: the source's digest}. UserError before any copy when a source is missing or a node
    lacks disk or rsync; UserError naming each node whose copy failed (nothing started then)."""
    return stage_items(plan, executor, [Item(i, s) for i, s in enumerate(plan.job.staging)], say)


def stage_items(plan: LaunchPlan, executor, items: list[Item], say) -> dict[str, str]:
    """stage() of these items."""
    if not items:
        return {}
    if not hasattr(executor, "rsync_shell"):
        raise UserError(f"staging: the {type(executor).__name__} transport cannot stage yet; "
                        "staging needs cluster.hosts reached over ssh")
    logins, t0 = list(dict.fromkeys(n.login for n in plan.nodes)), time.monotonic()
    for item in items:
        if not item.spec.on_node:
            item.names = _git_files(item.spec.path) if item.spec.what == "code" else None
            item.source = local_manifest(item.spec.path, item.names)
    _probe(plan, executor, logins, items)
    _refuse_unfit(items)
    for item in items:
        _copy_item(plan, executor, item, say, t0)
    return {item.spec.dst: item.source["digest"] for item in items}


def local_manifest(path: str, names: list[str] | None) -> dict:
    """The manifest of a source on this machine; a file whose size and mtime match the last
    manifest made of the same path keeps its hash (a second submit of a 14 GB model reads no
    byte of it). The last manifests: $MLAUNCH_HOME/manifests/, this user's."""
    from ..record.registry import home
    cache = os.path.join(home(), "manifests", hashlib.sha256(os.path.abspath(path).encode()).hexdigest() + ".json")
    try:
        with open(cache) as f:
            known = json.load(f)["files"]
    except (OSError, ValueError, KeyError):
        known = None
    man = mf.manifest(path, names, known)
    try:
        os.makedirs(os.path.dirname(cache), mode=0o700, exist_ok=True)
        with open(cache + ".tmp", "w") as f:
            json.dump(man, f)
        os.replace(cache + ".tmp", cache)
    except OSError:
        pass   # no cache: the next submit hashes again
    return man


def node_states(plan: LaunchPlan, executor, ranks: list[int]) -> dict[int, list[tuple[str, str, int]] | str]:
    """For `mlaunch check`: per node rank, each item's (label, state, bytes it lacks), state one
    of current, absent, changed, other (another content than the source's), no-source,
    no-room, no-rsync; or the probe's failure words. Copies nothing."""
    items = [Item(i, s) for i, s in enumerate(plan.job.staging)]
    for item in items:
        if not item.spec.on_node:
            item.source = local_manifest(item.spec.path, _git_files(item.spec.path) if item.spec.what == "code" else None)
    out: dict[int, list[tuple[str, str, int]] | str] = {}
    arg = json.dumps({"items": [{"dst": i.spec.dst, "src": i.spec.path if i.spec.on_node else None} for i in items]})
    script = nodeprog.script(remote_python(plan.job), "manifest", ["probe", arg])

    def one(r: int):
        code, text = executor.run(plan.nodes[r].login, script, PROBE_TIMEOUT_S)
        try:
            return r, json.loads(text.strip().splitlines()[-1]) if code == 0 else _last(text) or f"exit {code}"
        except (ValueError, IndexError):
            return r, _last(text) or f"exit {code}"
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(ranks)))) as pool:
        found = dict(pool.map(one, ranks))
    held = {}
    for k, item in enumerate(items):   # a node: source's manifest, from the first node that has it
        if item.spec.on_node:
            held[k] = next((f["items"][k]["src"] for f in found.values()
                            if isinstance(f, dict) and isinstance(f["items"][k]["src"], dict)), None)
    for r, f in found.items():
        out[r] = f if isinstance(f, str) else _states(items, f, held)
    return out


def _states(items: list[Item], f: dict, held: dict) -> list[tuple[str, str, int]]:
    """One node's probe f as node_states' rows."""
    rows = []
    for k, item in enumerate(items):
        p, src = f["items"][k], item.source or held.get(k)
        if src is None:
            rows.append((item.where, "no-source", 0))
            continue
        need = needed_bytes(src["files"], p["files"])
        state = ("current" if p["state"] == "current" and p["digest"] == src["digest"] else
                 "other" if p["state"] == "current" else p["state"])
        if state != "current" and need > p["free"]:
            state = "no-room"
        elif state != "current" and not f["rsync"]:
            state = "no-rsync"
        rows.append((item.where, state, 0 if state == "current" else need))
    return rows


def _git_files(top: str) -> list[str]:
    """The code item's files (code_files); UserError when git fails there."""
    names = code_files(top)
    if names is None:
        raise UserError(f"staging: `git ls-files` failed in {top}; is git installed, and is it a work tree?")
    return names


def _probe(plan: LaunchPlan, executor, logins: list[str], items: list[Item]) -> None:
    """Every node's state of every item (and the manifest of a node:PATH source where it has
    the path); the holder of each node:PATH source is the first node, in rank order, that has it."""
    def one(login: str) -> tuple[str, dict | str]:
        arg = json.dumps({"items": [{"dst": i.spec.dst, "src": i.spec.path if i.spec.on_node else None}
                                    for i in items]})
        code, out = executor.run(login, nodeprog.script(remote_python(plan.job), "manifest", ["probe", arg]),
                                 PROBE_TIMEOUT_S)
        last = (out.strip().splitlines() or [f"exit {code}"])[-1]
        if code != 0:
            return login, last
        try:
            return login, json.loads(last)
        except ValueError:
            return login, last
    with ThreadPoolExecutor(max_workers=min(32, len(logins))) as pool:
        found = dict(pool.map(one, logins))
    failed = [Problem(f"host {h}", f"staging probe failed: {r}") for h, r in found.items() if isinstance(r, str)]
    failed += [Problem(f"host {h}", "rsync is missing there; staging copies with it: install it there")
               for h, r in found.items() if isinstance(r, dict) and not r["rsync"]]
    if failed:
        raise UserError(failed, header="staging: nothing was started anywhere:")
    for k, item in enumerate(items):
        item.nodes = {h: found[h]["items"][k] for h in logins}
        if item.spec.on_node:
            item.holder = next((h for h in logins if isinstance(item.nodes[h]["src"], dict)), "")
            if not item.holder:
                raise UserError(f"staging[{k}].src: {item.spec.src!r}: no node of the run has "
                                f"{item.spec.path}; put it on one, or give a path on this machine")
            item.source = item.nodes[item.holder]["src"]


def _refuse_unfit(items: list[Item]) -> None:
    """One line per node and item whose disk cannot take what it lacks (before any copy)."""
    problems = []
    for item in items:
        for h in item.lacking():
            need = needed_bytes(item.source["files"], item.nodes[h]["files"])
            free = item.nodes[h]["free"]
            if need > free:
                problems.append(Problem(f"staging[{item.index}].dst", (
                    f"{item.spec.dst} on {h}: needs {size_text(need)}, {size_text(free)} free there; "
                    "free space on that disk or stage to another")))
    if problems:
        raise UserError(problems, header="staging: a node's disk is too small; nothing was copied or started:")


def _copy_item(plan: LaunchPlan, executor, item: Item, say, t0: float) -> None:
    """item to every node that lacks it, in rounds; its one line (bytes, time, rate). t0: when
    staging began (an item in place everywhere says how long finding that out took)."""
    lacking, n = item.lacking(), len(item.nodes)
    if not lacking:
        say(f"{item.where}: in place on all {n} nodes (manifests match), nothing copied "
            f"({size_text(item.source['bytes'])}; checked in {time.monotonic() - t0:.1f} s)")
        return
    t0, copies, failed = time.monotonic(), [], []
    for now in rounds([item.holder], lacking):
        with ThreadPoolExecutor(max_workers=len(now)) as pool:
            done = list(pool.map(lambda c: (c, copy_one(plan, executor, item, c)), now))
        for c, words in done:
            if words is not None and c.src != LAUNCHER and not item.spec.on_node:
                said = words   # a node could not feed another: this machine copies it itself
                words = copy_one(plan, executor, item, Copy(LAUNCHER, c.dst))
                say(f"{item.where}: {c.src} could not feed {c.dst} ({said}); copied from here")
            (failed if words is not None else copies).append((c, words))
        if failed:
            raise UserError([Problem(f"host {c.dst}", f"staging {item.spec.dst}: {w}") for c, w in failed],
                            header="staging failed; nothing was started anywhere:")
    took = time.monotonic() - t0
    size = item.source["bytes"]
    here = sum(1 for c, _ in copies if c.src == LAUNCHER)
    say(f"{item.where}: {size_text(size)} in {len(item.source['files'])} files to {len(lacking)} of {n} nodes "
        f"({here} from {'here' if item.holder == LAUNCHER else item.holder}, {len(lacking) - here} node to node) "
        f"in {took:.1f} s, {size_text(size * len(lacking) / max(took, 1e-6))}/s in all; "
        f"in place on {n - len(lacking)}")


def copy_one(plan: LaunchPlan, executor, item: Item, c: Copy) -> str | None:
    """One copy, then its check and rename on the receiving node; None, or the failure's words."""
    dst, tmp = item.spec.dst, item.spec.dst + TMP
    is_dir = len(item.source["files"]) != 1 or "" not in item.source["files"]
    slash = "/" if is_dir else ""
    link = dst if is_dir and item.nodes[c.dst]["state"] != "absent" else None
    if c.src == LAUNCHER:
        shell, host = executor.rsync_shell(c.dst)
        argv = render.staging_push_argv(link_dest=link, files_from=item.names is not None,
                                        parent=posixpath.dirname(dst), shell=shell,
                                        src=item.spec.path.rstrip("/") + slash, host=host, tmp=tmp + slash,
                                        tmp_name=tmp)
        listing = b"\0".join(n.encode("utf-8", "surrogateescape") for n in item.names or [])
        r = subprocess.run(argv, input=listing, capture_output=True, timeout=COPY_TIMEOUT_S)
        if r.returncode != 0:
            return _last(r.stderr.decode(errors="replace")) or f"rsync exit {r.returncode}"
        script = ""
    else:
        from_path = item.spec.path if c.src == item.holder and item.spec.on_node else dst
        same = c.src == c.dst
        script = render.staging_pull_script(
            link_dest=link, parent=posixpath.dirname(dst), shell=node_shell(plan, c.src), merge=False,
            host=None if same else node_host(c.src), src=from_path.rstrip("/") + slash, tmp=tmp + slash,
            tmp_name=tmp) + "\n"
    script += nodeprog.script(remote_python(plan.job), "manifest", ["commit", tmp, dst, item.source["digest"]])
    code, out = executor.run(c.dst, script, COPY_TIMEOUT_S)
    return None if code == 0 else (_last(out) or f"exit {code}")


def node_shell(plan: LaunchPlan, login: str) -> str:
    """The ssh command a node reaches login's node with: the run's user, port, key file and
    host-key policy (known_hosts: cluster.ssh's file, else the node's own)."""
    s, port = plan.job.cluster.ssh, login_addr(login).port
    known = os.path.expanduser(s.known_hosts) if s.known_hosts else "~/.ssh/known_hosts"
    argv = render.ssh_client_argv(
        alive_s=15, alive_count=4, ciphers=CIPHERS,
        connect_timeout=max(1, round(s.connect_timeout)), known_hosts=known, strict=s.strict_host_keys,
        config_file=None, key_file=os.path.expanduser(s.key_file) if s.key_file else None,
        user=s.user, port=port or (s.port if "port" in s.model_fields_set else None), proxy=None)
    return render.command_line(argv)


def node_host(login: str) -> str:
    """login as rsync names a remote host ([user@]name; a port is in the shell's -p)."""
    a = login_addr(login)
    return f"{a.user}@{a.name}" if a.user else a.name


def _last(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1].removeprefix("mlaunch: ") if lines else ""


def code_files(top: str) -> list[str] | None:
    """The files of a code item: what `git ls-files` lists in the work tree top, tracked and
    untracked that .gitignore does not exclude (None: git failed; its words are lost here,
    the copy says them)."""
    r = subprocess.run(["git", "-C", top, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       capture_output=True)
    if r.returncode != 0:
        return None
    return [n for n in r.stdout.decode("utf-8", "surrogateescape").split("\0")
            if n and os.path.isfile(os.path.join(top, n))]

"""Staging on hosts that share no disk (issue 54): the model and the code exist only on the
launcher's machine; every node gets them once (a manifest on each), node to node; a second
submit copies nothing; a changed file is copied again (the rest hard-linked, not sent); a disk
too small is one line before anything starts."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess

import pytest

from .helpers import mlaunch, script_job, write_spec

pytestmark = [pytest.mark.multihost, pytest.mark.launches]


def _model(root) -> str:
    """A model directory here: a config and 2 MB of weights."""
    d = os.path.join(str(root), "model")
    os.makedirs(os.path.join(d, "sub"))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"hidden": 8}, f)
    with open(os.path.join(d, "sub", "weights.bin"), "wb") as f:
        f.write(os.urandom(2 << 20))
    return d


def _code(root) -> str:
    """A git work tree here: two tracked files, one ignored."""
    d = os.path.join(str(root), "code")
    os.makedirs(d)
    for name, text in (("train.py", "print('hi')\n"), (".gitignore", "*.log\n"), ("big.log", "x" * 1000)):
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    subprocess.run(["git", "init", "-q", d], check=True)
    subprocess.run(["git", "-C", d, "add", "train.py", ".gitignore"], check=True)
    return d


def _sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _spec(hs, tmp_path, model: str, code: str, dst_model: str) -> dict:
    weights = os.path.join(dst_model, "sub", "weights.bin")
    spec = script_job([h.ip for h in hs.hosts], 1, "staged_job.py",
                      [weights, os.path.join(hs.disk, "work", "train.py")], str(tmp_path / "out"), hs=hs)
    spec["staging"] = [{"src": model, "dst": dst_model},
                       {"src": code, "dst": os.path.join(hs.disk, "work"), "what": "code"}]
    return spec


def test_staged_once_node_to_node_then_in_place_then_changed_file_recopied(make_hostset, tmp_path):
    model, code = _model(tmp_path), _code(tmp_path)
    with make_hostset(3, private_disk=True) as hs:
        dst = os.path.join(hs.disk, "models", "m")
        path = write_spec(tmp_path, _spec(hs, tmp_path, model, code, dst))
        r = mlaunch("submit", path, "--no-preflight", timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        out = r.stdout
        # one line per item: 3 nodes lacked it, one copy from here, two node to node
        assert re.search(r"staging\[0\] \S+: 2\.1 MB in 2 files to 3 of 3 nodes \(2 from here, 1 node to node\)", out), out
        assert re.search(r"staging\[1\] \S+: .* in 2 files to 3 of 3 nodes", out), out
        # the copies are their own phase, between the connect and the checkpoint look (no preflight)
        import glob
        from launcher.record.events import read_events
        (events,) = glob.glob(str(tmp_path / "**" / "events.jsonl"), recursive=True)
        marks = [e["phase"] for e in read_events(events) if e["event"] == "phase"]
        assert marks[:3] == ["connect", "staging", "checkpoint"], marks
        want = _sha(os.path.join(model, "sub", "weights.bin"))
        for h in hs.hosts:
            own = os.path.join(hs.disk_of(h), "models", "m")
            assert _sha(os.path.join(own, "sub", "weights.bin")) == want
            man = json.load(open(own + ".mlaunch-manifest"))
            assert set(man["files"]) == {"config.json", "sub/weights.bin"}
            assert man["files"]["sub/weights.bin"][1] == want
            work = os.path.join(hs.disk_of(h), "work")
            assert sorted(os.listdir(work)) == [".gitignore", "train.py"]   # git's files, not the ignored log
            assert not os.path.exists(own + ".mlaunch-tmp")
            # each rank read the staged files on its own node
            assert re.search(rf"staged {h.name} \d {re.escape(dst)}/sub/weights.bin {want}", out), out
        assert not os.path.exists(dst)   # the launcher's own view of that path: never written
        inodes = {h.name: os.stat(os.path.join(hs.disk_of(h), "models", "m", "sub", "weights.bin")).st_ino
                  for h in hs.hosts}

        r = mlaunch("submit", path, "--no-preflight", timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        assert f"staging[0] {dst}: in place on all 3 nodes (manifests match), nothing copied" in r.stdout
        assert "staging[1]" in r.stdout and r.stdout.count("nothing copied") == 2, r.stdout
        for h in hs.hosts:
            assert os.stat(os.path.join(hs.disk_of(h), "models", "m", "sub", "weights.bin")).st_ino == inodes[h.name]

        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump({"hidden": 16}, f)
        r = mlaunch("submit", path, "--no-preflight", timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        assert re.search(r"staging\[0\] \S+: .* to 3 of 3 nodes", r.stdout), r.stdout
        assert "staging[1]" in r.stdout and r.stdout.count("nothing copied") == 1, r.stdout
        for h in hs.hosts:
            own = os.path.join(hs.disk_of(h), "models", "m")
            assert json.load(open(os.path.join(own, "config.json"))) == {"hidden": 16}
            # the unchanged weights were hard-linked from the node's last copy, not sent again
            assert os.stat(os.path.join(own, "sub", "weights.bin")).st_ino == inodes[h.name]


def test_a_disk_too_small_is_one_line_before_anything_is_copied_or_started(make_hostset, tmp_path):
    model, code = _model(tmp_path), _code(tmp_path)
    with make_hostset(3, private_disk=True) as hs:
        small = hs.hosts[1]
        os.makedirs(os.path.join(hs.disk_of(small), "small"))
        r = small.in_mounts(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", os.path.join(hs.disk, "small")])
        assert r.returncode == 0, r.stderr
        dst = os.path.join(hs.disk, "small", "m")
        r = mlaunch("submit", write_spec(tmp_path, _spec(hs, tmp_path, model, code, dst)), "--no-preflight",
                    timeout=300)
        assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-2000:]
        lines = [ln for ln in r.stderr.splitlines() if "staging[0].dst" in ln]
        assert len(lines) == 1 and f"{dst} on {small.ip}: needs 2.1 MB, 1.0 MB free there" in lines[0], r.stderr
        assert "Traceback" not in r.stderr
        for h in hs.hosts:   # nothing copied anywhere, no rank started
            assert not os.path.exists(os.path.join(hs.disk_of(h), "small", "m"))
            assert not os.path.exists(os.path.join(hs.disk_of(h), "work"))
        assert "staged " not in r.stdout
        # `mlaunch check`'s storage/staged row says the same per node, and what submit would copy
        rows = {row.node: row for row in _staged_rows(_spec(hs, tmp_path, model, code, dst))}
        assert rows[1].status == "fail" and "lacks 2.1 MB, more than the free space" in rows[1].detail, rows[1]
        assert rows[0].status == "pass" and f"staging[0] {dst}: absent (submit copies 2.1 MB)" in rows[0].detail, rows[0]


def _staged_rows(spec: dict):
    """preflight's storage/staged rows of spec's job (what `mlaunch check` shows)."""
    from launcher.backends import backend_of
    from launcher.plan.launch_plan import build_plan
    from launcher.preflight import staged
    from launcher.preflight.probe import Ctx
    from launcher.spec import validate
    plan = build_plan(validate(spec))
    ex = backend_of(plan.job).transport(plan)
    assert ex.connect() == []
    try:
        return staged.check(Ctx(plan, ex))
    finally:
        ex.close()

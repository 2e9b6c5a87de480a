"""staging: the spec section's rules (one line each, exit 2), its fan-out rounds and the
dry-run's lines (issue 54). No host needed."""
from __future__ import annotations

import os
import subprocess

import pytest

from launcher.nodeprog import manifest as mf
from launcher.plan.staging import needed_bytes, rounds

from .helpers import mlaunch, script_job, write_spec


def _spec(tmp_path, staging) -> str:
    spec = script_job(["node-a", "node-b", "node-c"], 1, "staged_job.py", [], str(tmp_path / "out"))
    spec["staging"] = staging
    return write_spec(tmp_path, spec)


def test_rounds_double_the_holders_each_round():
    got = [[(c.src, c.dst) for c in r] for r in rounds([""], ["a", "b", "c", "d", "e", "f", "g", "h"])]
    assert got == [[("", "a")], [("", "b"), ("a", "c")], [("", "d"), ("a", "e"), ("b", "f"), ("c", "g")],
                   [("", "h")]]
    assert rounds(["x"], []) == []


def test_needed_bytes_counts_what_the_node_lacks_or_holds_otherwise():
    src = {"a": [10, "h1", 0], "b": [20, "h2", 0], "c": [5, "h3", 0]}
    assert needed_bytes(src, {}) == 35
    assert needed_bytes(src, {"a": [10, "h1"], "b": [20, "old"]}) == 25


def test_manifest_commit_refuses_a_copy_that_differs(tmp_path):
    src, tmp, dst = tmp_path / "src", tmp_path / "d.tmp", tmp_path / "d"
    for d in (src, tmp):
        d.mkdir()
        (d / "f").write_text("same")
    want = mf.manifest(str(src))["digest"]
    (tmp / "f").write_text("other")
    assert mf.commit(str(tmp), str(dst), want) == 3
    assert not tmp.exists() and not dst.exists()
    tmp.mkdir()
    (tmp / "f").write_text("same")
    assert mf.commit(str(tmp), str(dst), want) == 0
    assert (dst / "f").read_text() == "same" and mf.stored(str(dst))["digest"] == want
    assert mf.probe([{"dst": str(dst)}])["items"][0]["state"] == "current"
    (dst / "f").write_text("edited on the node")
    assert mf.probe([{"dst": str(dst)}])["items"][0]["state"] == "changed"


def test_rules_one_line_each(tmp_path):
    (tmp_path / "notgit").mkdir()
    r = mlaunch("validate", _spec(tmp_path, [
        {"src": str(tmp_path / "nothere"), "dst": "/nvme/m"},
        {"src": str(tmp_path), "dst": "relative/x"},
        {"src": str(tmp_path / "notgit"), "dst": "/nvme/m/inner", "what": "code"},
        {"src": "node:/data/a", "dst": "/nvme/d", "what": "code"},
        {"src": "node:data/a", "dst": "/nvme/e"},
    ]))
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr
    assert "Traceback" not in err
    assert f"staging[0].src: '{tmp_path}/nothere' does not exist on this machine; fix the path, or write node:" in err
    assert "staging[1].dst: 'relative/x': give an absolute path on the nodes below /" in err
    assert "staging[2].dst: '/nvme/m/inner' overlaps staging[0].dst '/nvme/m'; give each item a directory of its own" in err
    assert f"staging[2].what: code: '{tmp_path}/notgit' is not the top of a git work tree" in err
    assert "staging[3].what: code is listed by `git ls-files` on this machine" in err
    assert "staging[4].src: 'node:data/a': a node's path must be absolute" in err


def test_relative_src_is_beside_the_spec_and_the_dry_run_shows_the_plan(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "w.bin").write_bytes(b"x" * 3000)
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print(1)\n")
    subprocess.run(["git", "init", "-q", str(code)], check=True)
    subprocess.run(["git", "-C", str(code), "add", "train.py"], check=True)
    path = _spec(tmp_path, [{"src": "./model", "dst": "/nvme/m"},
                            {"src": "node:/data/alpaca", "dst": "/nvme/data"},
                            {"src": "code", "dst": "/nvme/work", "what": "code"}])
    r = mlaunch("submit", "--dry-run", path, cwd="/")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "staging: before any node starts, to each of the 3 nodes that lacks it" in out
    assert "(2 rounds at most)" in out
    assert f"staging[0] /nvme/m <- {model}: 3.0 kB in 1 files, from this machine" in out
    assert "staging[1] /nvme/data <- node:/data/alpaca: on a node of the run" in out
    assert f"staging[2] /nvme/work <- {code}: code, 1 files from git ls-files, 9 B, from this machine" in out
    assert os.path.isdir(model)


def test_replicas_inventory_and_prune(tmp_path):
    from launcher.nodeprog import replicas
    out = tmp_path / "out"
    (out / "checkpoint-5").mkdir(parents=True)
    (out / "checkpoint-5" / "rng_state_1.pth").write_bytes(b"r")
    (out / "checkpoint-10").mkdir()
    part = out / ".mlaunch-replicas" / "checkpoint-5" / "part0"
    part.mkdir(parents=True)
    (part / "rng_state_0.pth").write_bytes(b"r")
    (part / "trainer_state.json").write_text("{}")
    (out / ".mlaunch-replicas" / "checkpoint-5" / "part0.mlaunch-manifest").write_text("{}")
    (out / ".mlaunch-replicas" / "checkpoint-5" / "part2").mkdir()   # no manifest: a copy cut short
    inv = replicas.inventory(str(out), [1], 3)
    assert inv["own"] == {"5": {"complete": True, "state": False, "ranks": [1]},
                          "10": {"complete": False, "state": False, "ranks": []}}
    assert inv["replicas"] == {"5": {"0": [0]}}
    assert replicas.prune(str(out), [10]) == ["checkpoint-5", ".mlaunch-replicas/checkpoint-5"]
    assert sorted(os.listdir(out)) == [".mlaunch-replicas", "checkpoint-10"]


def test_checkpoints_rules_and_dry_run_policy(tmp_path):
    spec = script_job(["node-a", "node-b"], 1, "staged_job.py", [], str(tmp_path / "out"))
    spec["checkpoints"] = {"replicas": 2}
    r = mlaunch("validate", write_spec(tmp_path, spec))
    assert r.returncode == 2
    assert "checkpoints: replication reads LLaMA-Factory's checkpoint-N layout; trainer script" in r.stderr
    assert "checkpoints.replicas: 2: each part goes to other nodes, and there are 2; give at most 1" in r.stderr


def test_copies_lines_name_each_part_and_its_hosts():
    from launcher.record.runevents import copies_lines
    events = [{"event": "checkpoint_copies", "checkpoint": f"checkpoint-{n}",
               "parts": {"0": ["a", "b"], "10": ["c", "a"], "2": ["b", "c"]}} for n in (5, 10, 15, 20)]
    assert copies_lines(events + [{"event": "step"}]) == [
        f"checkpoint-{n}: part0 on a, b; part2 on b, c; part10 on c, a" for n in (10, 15, 20)]


def test_manifest_commit_writes_its_record_beside_the_copy_never_through_a_link(tmp_path):
    src, tmp, dst = tmp_path / "src", tmp_path / "d.tmp", tmp_path / "d"
    for d in (src, tmp):
        d.mkdir()
        (d / "f").write_text("same")
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / ("d" + mf.SUFFIX + ".tmp")).symlink_to(victim)   # planted where the record is written
    assert mf.commit(str(tmp), str(dst), mf.manifest(str(src))["digest"]) == 0
    assert victim.read_text() == "keep"
    assert mf.stored(str(dst))["digest"] == mf.manifest(str(src))["digest"]


def test_a_link_planted_at_the_temporary_name_is_removed_not_followed(tmp_path):
    """rsync -a --delete into a link's target would empty it (a teammate's directory, in a
    group-writable scratch): the node's copy script removes the link first."""
    import subprocess
    from launcher import render
    src, victim, tmp = tmp_path / "src", tmp_path / "victim", tmp_path / "d.mlaunch-tmp"
    src.mkdir()
    (src / "f").write_text("staged")
    victim.mkdir()
    (victim / "keep").write_text("theirs")
    tmp.symlink_to(victim)
    script = render.staging_pull_script(link_dest=None, parent=str(tmp_path), shell="ssh", merge=False,
                                        host=None, src=f"{src}/", tmp=f"{tmp}/", tmp_name=str(tmp))
    r = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (victim / "keep").read_text() == "theirs" and not (victim / "f").exists()
    assert not tmp.is_symlink() and (tmp / "f").read_text() == "staged"
    argv = render.staging_push_argv(link_dest=None, files_from=False, parent="/n", shell="ssh",
                                    src="/s/", host="h", tmp="/n/d.mlaunch-tmp/", tmp_name="/n/d.mlaunch-tmp")
    assert "[ ! -L /n/d.mlaunch-tmp ] || rm -f -- /n/d.mlaunch-tmp" in next(a for a in argv if a.startswith("--rsync-path="))


def _bare_plan(tmp_path, hosts=("n0", "n1", "n2")):
    from launcher.plan.launch_plan import build_plan
    from launcher.spec import validate
    from .test_badinput_cli import BASE
    job = validate({**BASE, "cluster": {**BASE["cluster"], "hosts": list(hosts)},
                    "output_dir": str(tmp_path / "out"), "checkpoints": {"replicas": 1},
                    "passthrough": {"save_total_limit": 1}})
    return build_plan(job, run_id="r")


def test_a_fresh_starts_restart_never_takes_an_earlier_runs_checkpoint_on_bare_nodes(tmp_path, monkeypatch):
    """--overwrite on nodes whose own disks still hold yesterday's checkpoint-500 (and copies of
    its parts): a restart resumes this run's newest complete checkpoint, never 500; the copies
    never copy it, and retention (save_total_limit) never removes it nor, because of it, this
    run's own."""
    from launcher.transport import replicas as rp
    plan = _bare_plan(tmp_path)
    logins = [n.login for n in plan.nodes]
    part = {"complete": True, "state": False, "ranks": []}
    inv = {lg: {"own": {"500": {**part, "state": i == 0}, "20": {**part, "state": i == 0}},
                "replicas": {"500": {str((i + 2) % 3): [0]}}} for i, lg in enumerate(logins)}
    monkeypatch.setattr(rp, "_inventories", lambda plan, executor: inv)
    taken, pruned, copied = [], [], []
    monkeypatch.setattr(rp, "_put_together", lambda plan, ex, say, num, parts, world: taken.append(num) or num)
    stale = rp.leftovers(plan, None)
    assert stale == {"500", "20"}   # before the run: both are an earlier run's
    inv = {lg: {"own": {**v["own"], "30": {**part, "state": i == 0}}, "replicas": {
        **v["replicas"], "30": {str((i + 2) % 3): [0]}}} for i, (lg, v) in enumerate(inv.items())}
    assert rp.assemble(plan, None, lambda line: None, {}, frozenset({"500"})) == "30"
    assert rp.assemble(plan, None, lambda line: None, {}) == "500"   # what it did without stale
    assert taken == ["30", "500"]

    class Exec:
        def run(self, login, script, timeout):
            if "prune" in script:
                pruned.append(script)
            return 0, "[]"
    rep = rp.Replicator(plan, Exec(), lambda line: None, None, {}, frozenset({"500"}))
    monkeypatch.setattr(rep, "_copy_all", lambda num, todo: copied.append(num) or True)
    monkeypatch.setattr(rep, "_record", lambda num, holders: rep.done.add(num))
    rep.round()
    assert copied == ["20", "30"]   # 500 never copied
    assert rep.done == {"30"}   # save_total_limit 1: this run's newest kept, its 20 removed ...
    assert pruned and all('["30", "500"]' in s for s in pruned)   # ... and the earlier run's 500 kept


def test_a_checkpoint_missing_the_last_nodes_part_is_not_taken_for_a_smaller_worlds(tmp_path, monkeypatch):
    """checkpoint-40's trainer_state.json is on node 0, then the last node is lost before its
    part was copied: the ranks left look like a complete world of 16. The copies noted the
    world that saved it (24) when node 0's state appeared, so a restart takes checkpoint-30,
    complete across copies, instead of a checkpoint with a third of its optimizer state missing."""
    from launcher.transport import replicas as rp
    plan = _bare_plan(tmp_path)
    logins = [n.login for n in plan.nodes]

    def part(i, state=False):
        return {"complete": True, "state": state, "ranks": list(range(8 * i, 8 * i + 8))}
    inv = {lg: {"own": {"30": part(i, i == 0), "40": part(i, i == 0)}, "replicas": {}}
           for i, lg in enumerate(logins[:2])}
    inv[logins[2]] = {"own": {"30": part(2)}, "replicas": {}}
    monkeypatch.setattr(rp, "_inventories", lambda plan, executor: inv)
    saved_world = {"30": 24}
    rep = rp.Replicator(plan, None, lambda line: None, None, saved_world)
    monkeypatch.setattr(rep, "_copy_all", lambda num, todo: False)
    rep.round()
    assert saved_world == {"30": 24, "40": 24}
    del inv[logins[2]]   # the last node is lost
    for v in inv.values():
        v["replicas"] = {"30": {"16": list(range(16, 24))}}   # 30's lost part has a copy
    taken = []
    monkeypatch.setattr(rp, "_put_together", lambda plan, ex, say, num, parts, world: taken.append((num, world)) or num)
    shrunk = _bare_plan(tmp_path, hosts=("n0", "n1"))   # the restart's nodes
    assert rp.assemble(shrunk, None, lambda line: None, saved_world) == "30"
    assert taken == [("30", 24)]


def test_tokenize_once_keeps_its_output_masked_in_a_private_file(tmp_path, monkeypatch):
    """LLaMA-Factory's tokenizing run has cluster.env's secrets exported and may print them:
    its output is masked before it is kept, in a 0600 file of the run's 0700 log directory, and
    the refusal that names that file shows no secret either."""
    import stat
    from launcher.errors import UserError
    from launcher.plan.launch_plan import build_plan
    from launcher.spec import validate
    from launcher.transport import tokenize
    from .test_badinput_cli import BASE
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnopqrstuvwxyz123456")
    job = validate({**BASE, "cluster": {**BASE["cluster"], "env": {"HF_TOKEN": "${HF_TOKEN}"}},
                    "output_dir": str(tmp_path / "out"), "tokenize_once": str(tmp_path / "tok")})
    plan = build_plan(job, run_id="r", log_dir=str(tmp_path / "logs"))

    class Node0:
        def run(self, login, script, timeout):
            return 1, "token is hf_abcdefghijklmnopqrstuvwxyz123456\nmlaunch-tokenize failed hf_abcdefghijklmnopqrstuvwxyz123456 refused\n"
    with pytest.raises(UserError) as err:
        tokenize.tokenize_once(plan, Node0(), lambda line: None, {})
    assert "hf_abcdefghijklmnopqrstuvwxyz123456" not in "\n".join(err.value.lines())
    log = os.path.join(plan.log_dir, tokenize.LOG)
    assert "hf_abcdefghijklmnopqrstuvwxyz123456" not in open(log).read() and "token is " in open(log).read()
    assert stat.S_IMODE(os.stat(log).st_mode) == 0o600 and stat.S_IMODE(os.stat(plan.log_dir).st_mode) == 0o700

"""A save never lands in another world's folder: before each attempt on a shared output_dir,
the checkpoint-N folders it may save again are moved whole into output_dir/mlaunch-set-aside/
(launcher/nodeprog/setaside.py, runs/outputdir.py clear_way). The node program runs here
as the launcher sends it (its source in a shell here-document); the attempt loop runs with
node 0's real helpers in a local shell."""
from __future__ import annotations

import json
import os
import sys

import pytest
from types import SimpleNamespace

from launcher import nodeprog
from launcher.errors import UserError
from launcher.nodeprog import setaside
from launcher.record.events import read_events
from launcher.runs import attempts
from launcher.runs.attempts import SubmitOptions
from launcher.runs.outputdir import Master
from launcher.spec import validate

from .helpers import plan_of
from .test_run_end import Rec, fails_once
from .test_shrink import lora
from .test_spares import Said
from .test_universal import ShellExecutor


def checkpoint(parent, step: int, complete: bool = True, shards: int = 1) -> str:
    d = os.path.join(parent, f"checkpoint-{step}")
    os.makedirs(os.path.join(d, f"global_step{step}"))
    for r in range(shards):
        with open(os.path.join(d, f"global_step{step}", f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"), "w") as fh:
            fh.write(f"shard {r} of step {step}")
    with open(os.path.join(d, "adapter_model.safetensors"), "w") as fh:
        fh.write(f"weights of step {step}")
    if complete:
        with open(os.path.join(d, "trainer_state.json"), "w") as fh:
            json.dump({"global_step": step}, fh)
    return d


def files(path: str) -> dict[str, str]:
    """Every file under path, relative, with its text."""
    out = {}
    for d, _, names in os.walk(path):
        for n in names:
            with open(os.path.join(d, n)) as fh:
                out[os.path.relpath(os.path.join(d, n), path)] = fh.read()
    return out


def remote(out: str, tag: str, *args: str) -> dict:
    """The program as the launcher runs it on node 0: its source through python3 in a shell."""
    code, text = ShellExecutor().run("node0", nodeprog.script("python3", "setaside", [out, tag, *args]), 60)
    assert code == 0, text
    got = json.loads(text.strip().splitlines()[-1])
    assert got.pop("after") == (setaside.resumed_step(args[args.index("--resume") + 1]) if "--resume" in args else None)
    return got


def test_only_the_steps_the_attempt_saves_again_move_whole_and_nothing_is_deleted(tmp_path):
    out = str(tmp_path / "out")
    for step in (4, 8, 12):
        checkpoint(out, step, shards=4)
    checkpoint(out, 16, complete=False, shards=4)   # a save cut part-way
    before = files(out)
    got = remote(out, "r-attempt1", "--resume", os.path.join(out, "checkpoint-8"))
    aside = os.path.join(out, "mlaunch-set-aside", "r-attempt1")
    assert got == {"moved": ["checkpoint-12", "checkpoint-16"], "to": aside}
    assert sorted(os.listdir(out)) == ["checkpoint-4", "checkpoint-8", "mlaunch-set-aside"]
    after = files(out)
    assert len(after) == len(before)   # every file kept, the moved ones byte for byte
    for rel, text in before.items():
        step = rel.split("/")[0]
        moved = f"mlaunch-set-aside/r-attempt1/{rel}" if step in ("checkpoint-12", "checkpoint-16") else rel
        assert after[moved] == text, rel


def test_a_fresh_start_moves_every_checkpoint_and_a_second_attempt_keeps_the_first_ones(tmp_path):
    out = str(tmp_path / "out")
    checkpoint(out, 10)
    checkpoint(out, 100)   # numbers sort as numbers: 10 before 100
    assert remote(out, "r-attempt0")["moved"] == ["checkpoint-10", "checkpoint-100"]
    checkpoint(out, 10)
    assert remote(out, "r-attempt1")["moved"] == ["checkpoint-10"]
    top = os.path.join(out, "mlaunch-set-aside")
    assert sorted(os.listdir(top)) == ["r-attempt0", "r-attempt1"]
    assert sorted(os.listdir(os.path.join(top, "r-attempt0"))) == ["checkpoint-10", "checkpoint-100"]


def test_a_resume_from_the_set_aside_folder_clears_output_dirs_own_top_level(tmp_path):
    """The trainer saves into output_dir's top level whatever it resumes: resumed from a folder
    an earlier attempt set aside, output_dir's newer checkpoints move, that folder stays."""
    out = str(tmp_path / "out")
    old = os.path.join(out, "mlaunch-set-aside", "r-attempt0")
    checkpoint(old, 100)
    checkpoint(out, 200)
    got = remote(out, "s-attempt0", "--resume", os.path.join(old, "checkpoint-100"))
    assert got == {"moved": ["checkpoint-200"], "to": os.path.join(out, "mlaunch-set-aside", "s-attempt0")}
    assert os.path.isdir(os.path.join(old, "checkpoint-100"))


def test_the_resumed_checkpoint_is_never_moved_whatever_its_names_say(tmp_path):
    """checkpoint-300, a link to checkpoint-100 (whose trainer_state says 100), resumed: the
    larger number counts, and the resumed folder itself never moves."""
    out = str(tmp_path / "out")
    checkpoint(out, 100)
    checkpoint(out, 400)
    os.symlink("checkpoint-100", os.path.join(out, "checkpoint-300"))
    got = remote(out, "r-attempt0", "--resume", os.path.join(out, "checkpoint-300"))
    assert got["moved"] == ["checkpoint-400"], got
    assert os.path.islink(os.path.join(out, "checkpoint-300")) and os.path.isdir(os.path.join(out, "checkpoint-100"))
    assert setaside.set_aside(out, "r-attempt1", 0, keep=os.path.join(out, "checkpoint-300"))["moved"] == []


def test_output_dir_spelled_through_a_link_stays_inside_it(tmp_path):
    """output_dir given through a link, --resume through the real path: the moves stay in
    output_dir/mlaunch-set-aside, nothing is made beside it."""
    real = tmp_path / "real" / "out"
    real.mkdir(parents=True)
    os.symlink(tmp_path / "real", tmp_path / "alias")
    out = str(tmp_path / "alias" / "out")
    checkpoint(str(real), 5)
    checkpoint(str(real), 10)
    got = remote(out, "r-attempt0", "--resume", str(real / "checkpoint-5"))
    assert got == {"moved": ["checkpoint-10"], "to": os.path.join(out, "mlaunch-set-aside", "r-attempt0")}
    assert sorted(os.listdir(tmp_path)) == ["alias", "real"] and sorted(os.listdir(tmp_path / "real")) == ["out"]
    assert os.path.isdir(real / "mlaunch-set-aside" / "r-attempt0" / "checkpoint-10")


def test_a_checkpoint_outside_output_dir_clears_output_dir_above_its_step(tmp_path):
    out, elsewhere = str(tmp_path / "out"), str(tmp_path / "elsewhere")
    checkpoint(out, 6)
    checkpoint(out, 9)
    ck = checkpoint(elsewhere, 7)
    os.rename(ck, os.path.join(elsewhere, "my-best"))   # a name without the step: trainer_state says 7
    assert remote(out, "r-attempt0", "--resume", os.path.join(elsewhere, "my-best"))["moved"] == ["checkpoint-9"]
    assert sorted(os.listdir(elsewhere)) == ["my-best"]


def test_a_step_nobody_knows_moves_nothing(tmp_path):
    out = str(tmp_path / "out")
    checkpoint(out, 9)
    os.makedirs(tmp_path / "plain")
    got = remote(out, "r-attempt0", "--resume", str(tmp_path / "plain"))
    assert got["moved"] == [] and os.path.isdir(os.path.join(out, "checkpoint-9"))


def test_a_link_at_the_set_aside_folder_is_never_followed_out(tmp_path):
    """Someone's link output_dir/mlaunch-set-aside -> their folder: nothing is moved there."""
    out, theirs = str(tmp_path / "out"), tmp_path / "theirs"
    theirs.mkdir()
    checkpoint(out, 3)
    os.symlink(theirs, os.path.join(out, "mlaunch-set-aside"))
    got = remote(out, "r-attempt0")
    assert got["moved"] == [] and "leads out of" in got["error"], got
    assert os.listdir(theirs) == [] and os.path.isdir(os.path.join(out, "checkpoint-3"))


def test_another_users_set_aside_folder_is_never_moved_into(tmp_path):
    """output_dir/mlaunch-set-aside made by another user (they could read or change what is
    moved there): refused, nothing moved."""
    if os.getuid() != 0:
        pytest.skip("making a folder another user's own needs root (the suite runs as root)")
    out = str(tmp_path / "out")
    checkpoint(out, 3)
    theirs = os.path.join(out, "mlaunch-set-aside")
    os.makedirs(theirs)
    os.chown(theirs, os.getuid() + 1, -1)
    got = remote(out, "r-attempt0")
    assert got["moved"] == [] and got["error"].endswith("is not this user's own folder"), got
    assert os.listdir(theirs) == [] and os.path.isdir(os.path.join(out, "checkpoint-3"))


def test_a_name_already_set_aside_is_never_replaced(tmp_path):
    out = str(tmp_path / "out")
    checkpoint(out, 3)
    kept = os.path.join(out, "mlaunch-set-aside", "r-attempt0", "checkpoint-3")
    os.makedirs(kept)
    got = remote(out, "r-attempt0")
    assert got["error"] == f"{kept} already exists" and got["path"] == os.path.join(out, "checkpoint-3")
    assert os.path.isdir(os.path.join(out, "checkpoint-3"))


def test_a_restart_moves_the_cut_save_before_it_starts_and_says_so(tmp_path):
    """The attempt loop with node 0's real helpers: attempt 0 saves checkpoint-8 at world 3 and
    is cut mid-save of checkpoint-12 (its shards, no trainer_state.json); the restart resumes
    checkpoint-8, and before it starts, checkpoint-12 is in the set-aside folder, said in one
    line and a checkpoints_set_aside event. A failed move ends the run before the attempt."""
    out = str(tmp_path / "out")
    job = validate(lora(hosts=3, gpus=1, per_device=1, grad_accum=2, python=sys.executable) | {
        "output_dir": out, "max_restarts": 1, "restart_backoff_s": 0})
    seen = []

    def attempt(plan):   # what the attempt found; the first one saves 8, then is cut saving 12
        found = (plan.resume_from, sorted(os.listdir(out)))
        if not seen:
            checkpoint(out, 8, shards=3)
            checkpoint(out, 12, complete=False, shards=3)
        return found
    backend = fails_once(seen, attempt)
    logs = str(tmp_path / "logs")
    plan = plan_of(job, run_id="r", log_dir=logs)
    os.makedirs(out)
    master = Master(plan, ShellExecutor())
    master.discover()
    said = Said()
    code = attempts._attempts(plan, ShellExecutor(), said, SubmitOptions(log_dir=logs), master, None,
                              Rec(), backend)
    ck8 = os.path.join(out, "checkpoint-8")
    assert code == 0 and seen == [(None, []), (ck8, ["checkpoint-8", "mlaunch-set-aside"])], seen
    aside = os.path.join(out, "mlaunch-set-aside", "r-attempt1")
    assert sorted(files(aside)) == ["checkpoint-12/adapter_model.safetensors"] + [
        f"checkpoint-12/global_step12/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(3)]
    assert any(line.startswith(f"output_dir: checkpoint-12 moved to {aside} before attempt 1")
               for line in said.lines), said.lines
    events = read_events(os.path.join(plan.log_dir, "events.jsonl"))
    moved = [(e["attempt"], e["moved"], e["to"]) for e in events if e["event"] == "checkpoints_set_aside"]
    assert moved == [(1, ["checkpoint-12"], aside)]


def test_a_move_that_fails_ends_the_run_before_the_attempt_names_the_folder_and_keeps_the_record(tmp_path):
    """A fresh start (--overwrite) over checkpoint-3 and checkpoint-4, where the set-aside
    folder already holds a checkpoint-4: checkpoint-3 moves, checkpoint-4 stays, no attempt
    starts, the error names checkpoint-4 and the fix, and the run's record is kept (it changed
    output_dir)."""
    out = str(tmp_path / "out")
    job = validate(lora(hosts=2, gpus=1, per_device=1, grad_accum=3, python=sys.executable) | {"output_dir": out})
    checkpoint(out, 3)
    checkpoint(out, 4)
    os.makedirs(os.path.join(out, "mlaunch-set-aside", "r-attempt0", "checkpoint-4"))
    started = []
    backend = SimpleNamespace(name="ssh", run_attempt=lambda plan, *a: started.append(plan))
    logs = str(tmp_path / "logs")
    plan = plan_of(job, run_id="r", log_dir=logs)
    master = Master(plan, ShellExecutor())
    master.discover()
    rec, said = Rec(), Said()
    try:
        attempts._attempts(plan, ShellExecutor(), said, SubmitOptions(log_dir=logs, overwrite=True), master,
                           None, rec, backend)
        raise AssertionError("no refusal")
    except UserError as e:
        assert e.lines() == [f"output_dir: could not move {out}/checkpoint-4 out of the way of attempt 0's saves: "
                             f"{out}/mlaunch-set-aside/r-attempt0/checkpoint-4 already exists; move it out of {out} "
                             "yourself (nothing was deleted), then submit again"]
    assert started == [] and getattr(rec, "changed", False)
    assert sorted(os.listdir(out)) == ["checkpoint-4", "mlaunch-set-aside"]
    assert sorted(os.listdir(os.path.join(out, "mlaunch-set-aside", "r-attempt0"))) == ["checkpoint-3", "checkpoint-4"]
    assert said.lines[-1].startswith(f"output_dir: checkpoint-3 moved to {out}/mlaunch-set-aside/r-attempt0")


def test_only_trainers_that_save_into_output_dir_itself_are_cleared():
    """ms-swift makes a new v<M>-<time> folder for every run unless add_version is off; a script
    job's checkpoints are its own."""
    from launcher.plan.trainers import TRAINERS
    swift = TRAINERS["swift"].saves_in_output_dir
    assert not swift(SimpleNamespace(passthrough={}))
    assert swift(SimpleNamespace(passthrough={"add_version": False}))
    assert swift(SimpleNamespace(passthrough={"no_add_version": True}))
    assert TRAINERS["llamafactory"].saves_in_output_dir(None)
    assert not TRAINERS["script"].saves_in_output_dir(None)


class PerNode(ShellExecutor):
    """Each login's own disk: node scripts run in a local shell with output_dir swapped for
    that login's folder (a node program gets output_dir as an argument)."""

    def __init__(self, out: str, disks: dict[str, str]):
        super().__init__()
        self.out, self.disks = out, disks

    def run(self, login, script, timeout):   # the spec's /opt/conda python: this one
        script = script.replace(self.out, self.disks[login]).replace("/opt/conda/bin/python", sys.executable)
        return super().run(login, script, timeout)


def test_a_restart_on_bare_nodes_moves_each_nodes_cut_save_and_its_copies(tmp_path):
    """No shared disk: attempt 0 saved checkpoint-8 at world 4 and was cut saving checkpoint-12,
    leaving each node's own part of it (n1 holds the lost fourth node's rank 3 too) and a copy
    of a part. Before the shrunk restart (resuming checkpoint-8), every node's checkpoint-12 and
    its copies are moved aside, checkpoint-8 stays, and the copies forget that 12 was saved at
    world 4. A fresh start (attempt 0) moves nothing: an earlier run's numbers are never resumed."""
    from launcher.runs import bare
    from .test_spares import Events
    from .test_staging_spec import _bare_plan
    plan = _bare_plan(tmp_path)
    out = plan.job.output_dir
    disks = {n.login: str(tmp_path / f"disk-{n.login}") for n in plan.nodes}
    for i, d in enumerate(disks.values()):
        checkpoint(d, 8)
        if i < 2:
            checkpoint(d, 12, complete=False, shards=1 + 2 * i)
    os.makedirs(os.path.join(disks["n0"], ".mlaunch-replicas", "checkpoint-12", "part2"))
    saved_world = {"8": 3, "12": 4, "16": 4}   # 16: saved by node 0 alone, lost with it
    said, events = Said(), Events()
    ex = PerNode(out, disks)
    assert bare.clear_way(plan, ex, said, events, None, saved_world) == frozenset()
    assert all(os.path.isdir(os.path.join(d, "checkpoint-8")) for d in disks.values()) and said.lines == []
    restart = plan.replanned(attempt=1, resume_from=os.path.join(out, "checkpoint-8"))
    moved = bare.clear_way(restart, ex, said, events, os.path.join(out, "checkpoint-8"), saved_world)
    assert moved == {"12"} and saved_world == {"8": 3}   # every number above the resumed step forgotten
    for login, d in disks.items():
        assert sorted(set(os.listdir(d)) - {".mlaunch-replicas"}) == (
            ["checkpoint-8"] if login == "n2" else ["checkpoint-8", "mlaunch-set-aside"])
    assert os.listdir(os.path.join(disks["n0"], ".mlaunch-replicas")) == []
    aside = os.path.join(disks["n1"], "mlaunch-set-aside", "r-attempt1", "checkpoint-12", "global_step12")
    assert sorted(os.listdir(aside)) == [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(3)]
    assert os.path.isdir(os.path.join(disks["n0"], "mlaunch-set-aside", "r-attempt1", ".mlaunch-replicas",
                                      "checkpoint-12", "part2"))
    assert said.lines == [f"checkpoints: moved to {out}/mlaunch-set-aside/r-attempt1 on each node before attempt 1, "
                          "which saves those steps again (n0: checkpoint-12, .mlaunch-replicas/checkpoint-12; "
                          "n1: checkpoint-12); nothing was deleted"], said.lines
    assert events.seen == [("checkpoints_set_aside", {"moved": [".mlaunch-replicas/checkpoint-12", "checkpoint-12"],
                                                      "to": f"{out}/mlaunch-set-aside/r-attempt1", "hosts": ["n0", "n1"]})]


def test_the_dry_run_of_overwrite_says_the_older_checkpoints_are_set_aside(tmp_path):
    from .helpers import mlaunch, write_spec
    data = lora(hosts=2, gpus=1, per_device=1, grad_accum=3) | {"output_dir": str(tmp_path / "out")}
    path = write_spec(tmp_path, data)
    r = mlaunch("submit", path, "--dry-run", "--overwrite")
    assert r.returncode == 0, r.stderr
    assert (f"output_dir: before each attempt, the checkpoint-N folders it may save again (all of them at "
            f"this fresh start; above the resumed step on a restart) are moved into {tmp_path}/out/"
            "mlaunch-set-aside/<run>-attempt<k>/, nothing deleted") in r.stdout
    assert "mlaunch-set-aside" not in mlaunch("submit", path, "--dry-run").stdout


def test_bare_nodes_set_aside_once_per_machine_and_each_machines_answer_is_its_own(tmp_path):
    """n1:2222 and n1:2223 are two machines (two sshds: containers, two disks); n0 and N0:22 are
    one (DNS ignores case; 22 is cluster.ssh.port). One set-aside per machine, each answer under
    its own login: n1:2223's failed move is said as n1:2223's, and ends the run, whatever the
    other n1's answer was (before, both were filed under `n1` and the later one won)."""
    if os.getuid() != 0:
        pytest.skip("making a folder another user's own needs root (the suite runs as root)")
    from launcher.runs import bare
    from launcher.errors import UserError
    from .test_spares import Events
    from .test_staging_spec import _bare_plan
    from launcher.plan.launch_plan import build_plan
    plan = _bare_plan(tmp_path)
    cluster = {"hosts": ["n0", "N0:22", "n1:2222", "n1:2223"], "cuda_visible_devices": [list(range(4)),
               list(range(4, 8)), list(range(8)), list(range(8))]}   # n0's 8 GPUs, half each
    plan = build_plan(plan.job.model_copy(update={"cluster": plan.job.cluster.model_copy(update=cluster)}),
                      run_id="r")
    out = plan.job.output_dir
    disk = {"n0": "a", "N0:22": "a", "n1:2222": "b", "n1:2223": "c"}
    disks = {n.login: str(tmp_path / f"disk-{disk[n.login]}") for n in plan.nodes}
    for d in set(disks.values()):
        checkpoint(d, 8)
        checkpoint(d, 12, complete=False)
    theirs = os.path.join(disks["n1:2223"], "mlaunch-set-aside")
    os.makedirs(theirs)
    os.chown(theirs, os.getuid() + 1, -1)
    ex = PerNode(out, disks)
    restart = plan.replanned(attempt=1, resume_from=os.path.join(out, "checkpoint-8"))
    said, events = Said(), Events()
    with pytest.raises(UserError) as e:
        bare.clear_way(restart, ex, said, events, os.path.join(out, "checkpoint-8"), {})
    assert str(e.value).startswith(f"on n1:2223: could not move {disks['n1:2223']}/checkpoint-12"), str(e.value)
    assert "is not this user's own folder" in str(e.value) and "n1:2222" not in str(e.value)
    assert said.lines == [f"checkpoints: moved to {out}/mlaunch-set-aside/r-attempt1 on each node before "
                          "attempt 1, which saves those steps again (n0: checkpoint-12; n1:2222: "
                          "checkpoint-12); nothing was deleted"], said.lines
    assert os.path.isdir(os.path.join(disks["n1:2223"], "checkpoint-12"))   # not moved, not lost


def test_a_set_aside_folder_owned_by_output_dirs_owner_is_used(tmp_path):
    """Root-squashed NFS: what this user makes belongs to `nobody`, as output_dir does. The
    set-aside folder attempt 0 made is output_dir's owner's: a restart moves into it."""
    if os.getuid() != 0:
        pytest.skip("changing a folder's owner needs root (the suite runs as root)")
    out = str(tmp_path / "out")
    checkpoint(out, 3)
    assert remote(out, "r-attempt0")["moved"] == ["checkpoint-3"]
    for d in (out, os.path.join(out, "mlaunch-set-aside")):
        os.chown(d, 65534, -1)
    checkpoint(out, 5)
    got = remote(out, "r-attempt1")
    assert got == {"moved": ["checkpoint-5"], "to": os.path.join(out, "mlaunch-set-aside", "r-attempt1")}, got


def test_an_unreadable_folder_is_said_as_such_not_as_a_failed_move(tmp_path, monkeypatch):
    """A listing that fails (permissions) names the folder as unreadable; the launcher's line
    says it could not look there, never that it could not move output_dir itself."""
    from launcher.runs import outputdir
    out = str(tmp_path / "out")
    checkpoint(out, 3)

    def denied(path):
        raise PermissionError(13, "Permission denied", path)
    monkeypatch.setattr(setaside.os, "listdir", denied)
    got = setaside.set_aside(out, "r-attempt1")
    assert got == {"moved": [], "to": None, "error": "Permission denied", "unreadable": out}, got
    monkeypatch.undo()
    master = SimpleNamespace(last=None, set_aside=lambda tag, resume: got)
    plan = SimpleNamespace(job=validate(lora(hosts=1, gpus=1, python=sys.executable) | {"output_dir": out}),
                           attempt=1, run_id="r")
    with pytest.raises(UserError) as e:
        outputdir.clear_way(plan, master, Said(), None, None)
    assert e.value.lines() == [f"output_dir: could not look for checkpoint folders that attempt 1 saves again "
                               f"in {out} (Permission denied); make it readable and writable for this user, "
                               "then submit again (nothing was moved)"]


def test_a_bare_restart_from_a_checkpoint_named_otherwise_forgets_only_the_steps_above_it(tmp_path):
    """--resume=.../best (global_step 8 in its trainer_state.json, no number in its name): the
    nodes clear above step 8 and say so; the copies forget only the worlds of steps above 8
    (before, every saved world was forgotten, and a checkpoint missing its top ranks' parts
    could read as complete)."""
    import shutil
    from launcher.runs import bare
    from .test_spares import Events
    from .test_staging_spec import _bare_plan
    plan = _bare_plan(tmp_path)
    out = plan.job.output_dir
    disks = {n.login: str(tmp_path / f"disk-{n.login}") for n in plan.nodes}
    for d in disks.values():
        checkpoint(d, 8)
        checkpoint(d, 12, complete=False)
        shutil.copytree(os.path.join(d, "checkpoint-8"), os.path.join(d, "best"))
    saved_world = {"4": 3, "8": 3, "12": 4}
    restart = plan.replanned(attempt=1, resume_from=os.path.join(out, "best"))
    moved = bare.clear_way(restart, PerNode(out, disks), Said(), Events(), os.path.join(out, "best"), saved_world)
    assert moved == {"12"} and saved_world == {"4": 3, "8": 3}
    assert all(sorted(os.listdir(d)) == ["best", "checkpoint-8", "mlaunch-set-aside"] for d in disks.values())

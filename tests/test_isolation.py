"""One run never touches another: strict run ids, and teardown by the exact environment entry."""
from __future__ import annotations

import os

import pytest

from .helpers import script_job, write_spec
from .runs import Runs
from .test_fanout import job_pids

RUN_ID_FIX = ("a run id is 1-128 letters, digits, '.', '_' or '-', starting with a letter or "
              "digit (no '/', no '..'); give such an id, or leave --run-id out for a fresh one")


@pytest.fixture
def runs(tmp_path) -> Runs:
    return Runs(str(tmp_path / "home"))


@pytest.mark.parametrize("bad", ["", "../../x", "/tmp/elsewhere", "a/b", ".*", "..", ".hidden",
                                 "x" * 129, "a b", "a\nb"])
@pytest.mark.parametrize("dry", [False, True])
def test_a_bad_run_id_is_refused_before_anything_is_written(tmp_path, runs, bad, dry):
    out = tmp_path / "out"
    spec = script_job(["localhost"], 1, "fail_or_sleep.py", ["0", "0", "0"], str(out),
                      workdir=str(tmp_path / "work"))
    r = runs.cli("submit", write_spec(tmp_path, spec), "--run-id", bad, "--no-preflight",
                 *(["--dry-run"] if dry else []))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and r.stdout == "", r.stderr
    shown = bad if len(bad) <= 80 else bad[:77] + "..."
    assert r.stderr == f"mlaunch: --run-id {shown!r}: {RUN_ID_FIX}\n"
    # Nothing started, nothing written: no registry, no logs, no run dir, nothing outside.
    assert not os.path.exists(runs.home) and not out.exists() and not (tmp_path / "work").exists()
    assert not os.path.exists("/tmp/elsewhere") and not (tmp_path.parent / "x").exists()


def _environ(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return fh.read().split(b"\0")
    except OSError:
        return []


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def ranks_and_agents(host, run_id: str) -> set[int]:
    """In host's namespace: the processes carrying exactly MLAUNCH_RUN_ID=<run_id> that are
    ranks (RANK set) and their parents (torchrun's agent). The hang-up guard's heartbeat
    readers come and go every few seconds, so they are left out of the count."""
    entry = f"MLAUNCH_RUN_ID={run_id}".encode()
    ranks = {p for p in host.pids()
             if entry in (env := _environ(p)) and any(e.startswith(b"RANK=") for e in env)}
    return ranks | {q for q in map(_ppid, ranks) if q and entry in _environ(q)}


def _sleepers(hs, out: str) -> dict:
    """2 hosts x 2 ranks that print `ready rank R` and sleep until torn down."""
    return script_job([h.ip for h in hs.hosts], 2, "fail_or_sleep.py", ["-1", "0", "0"], out,
                      hs=hs, hangup_after_s=600)


@pytest.mark.multihost
def test_teardown_of_one_run_spares_lookalike_ids(make_hostset, tmp_path, runs):
    """Bystanders `aXb` (which the pattern a.b matches) and `a.b2` (whose entry begins with
    the victim's) keep every process when run `a.b` fails fast and is torn down."""
    with make_hostset(2) as hs:
        ids = ("aXb", "a.b2")
        for run_id in ids:
            runs.detach(tmp_path, _sleepers(hs, str(tmp_path / run_id)), "--run-id", run_id,
                        name=f"{run_id}.yaml")
        for run_id in ids:
            runs.wait_console(run_id, r"ready rank \d", count=4)
        before = {(h.name, i): ranks_and_agents(h, i) for h in hs.hosts for i in ids}
        assert all(len(p) == 3 for p in before.values()), before   # 2 ranks + torchrun's agent
        victim = script_job([h.ip for h in hs.hosts], 2, "fail_or_sleep.py", ["1", "1", "0"],
                            str(tmp_path / "victim"), hs=hs)
        r = runs.cli("submit", write_spec(tmp_path, victim, "victim.yaml"), "--run-id", "a.b",
                     "--no-preflight")
        assert r.returncode == 1, r.stdout[-2000:] + r.stderr
        for (host, run_id), pids in before.items():   # per namespace, per bystander
            h = next(x for x in hs.hosts if x.name == host)
            alive = set(h.pids())
            assert pids <= alive, (host, run_id, pids - alive)
            assert ranks_and_agents(h, run_id) == pids
        assert all(not ranks_and_agents(h, "a.b") for h in hs.hosts)
        assert {x["id"]: x["state"] for x in runs.ps(all_=False)} == {i: "running" for i in ids}
        for run_id in ids:
            s = runs.cli("stop", run_id)
            assert s.returncode == 0, s.stdout + s.stderr
        assert {h.name: job_pids(h, set()) for h in hs.hosts} == {h.name: set() for h in hs.hosts}

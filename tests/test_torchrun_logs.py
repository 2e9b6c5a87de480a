"""torchrun's --tee copy of every rank's output (its --log-dir under the run directory, on each
host): removed once an attempt ended well with no teardown, since every line of it is in the
launcher's node log (masked); kept after a failure, where the console points to it for what
the ranks wrote after the teardown began. Before, every run left it, unmasked, on every host
(a log-flood test's 0.5 GB in /tmp)."""
from __future__ import annotations

import glob
import os

import pytest

from .helpers import script_job
from .test_fanout import check_allreduce, submit


def _run_id(out: str) -> str:
    found = glob.glob(os.path.join(out, "logs", "*", "events.jsonl"))
    assert len(found) == 1, found
    return os.path.basename(os.path.dirname(found[0]))


def _on_host(h, run_id: str) -> list[str]:
    """What the run directory of run_id holds on host h, as the host sees its own disk."""
    r = h.run(["sh", "-c", f"cd /tmp/mlaunch-*/.mlaunch/{run_id} && ls -A"])
    assert r.returncode == 0, r.stderr
    return sorted(r.stdout.split())


@pytest.mark.multihost
def test_a_run_that_ended_well_leaves_no_torchrun_copy_and_a_failed_one_keeps_it(make_hostset, tmp_path):
    with make_hostset(2) as hs:
        out = str(tmp_path / "ok")
        r = submit(tmp_path, script_job([h.ip for h in hs.hosts], 2, "allreduce.py", [], out, hs=hs))
        check_allreduce(r, 4, 2, out)
        ok = _run_id(out)
        for h in hs.hosts:
            left = _on_host(h, ok)
            assert "torchrun" not in left and any(f.endswith(".pid") for f in left), (h.name, left)
        out = str(tmp_path / "failed")
        r = submit(tmp_path, script_job([h.ip for h in hs.hosts], 2, "fail_or_sleep.py", ["2", "3", "0"],
                                        out, hs=hs))
        assert r.returncode == 3, r.stdout[-3000:]
        failed = _run_id(out)
        for h in hs.hosts:
            assert "torchrun" in _on_host(h, failed), h.name
        copy = hs.hosts[1].run(["sh", "-c", f"cat /tmp/mlaunch-*/.mlaunch/{failed}/torchrun/node1/*/attempt_0/0/stdout.log"])
        assert "rank 2 exiting 3" in copy.stdout, copy.stdout + copy.stderr


def test_only_the_runs_own_torchrun_folders_are_ever_named():
    """A `--log-dir` among a job's own arguments (a node without torchrun) is never removed."""
    from types import SimpleNamespace
    from launcher.session.attempt import torchrun_logs
    node = lambda login, argv: SimpleNamespace(login=login, argv=tuple(argv))  # noqa: E731
    plan = SimpleNamespace(run_dir="/tmp/r", nodes=[
        node("a", ["torchrun", "--log-dir", "/tmp/r/torchrun/node0", "train.py", "--log-dir", "/data"]),
        node("b", ["python", "-m", "llamafactory.launcher", "--log-dir", "/data/mine"]),
        node("c", ["torchrun", "--log-dir", "/tmp/r/torchrun/../../etc"])])
    assert torchrun_logs(plan) == {"a": ["/tmp/r/torchrun/node0"]}

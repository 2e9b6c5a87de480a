"""Preflight on master_addr and datasets, each on real hosts (namespace+sshd, or localhost):

1. a master_addr that is no address of node 0 (torchrun's store listens there) is refused by
   network/master-addr before anything starts, on one host and on two; leaving it out, or
   node 0's own address, passes; another host's address stays refused by validate;
2. a dataset name that dataset_info.json does not list gets "did you mean …?" (or the names it
   lists), not "copy the dataset directory"; so does a misspelt ms-swift dataset path; a
   node whose dataset_info.json lacks a name the other node's lists keeps the copy advice.
"""
from __future__ import annotations

import json
import os
import sys
import time

import pytest

from launcher.errors import UserError
from launcher.nodeprog.ports import own_address
from launcher.spec import validate

from .helpers import mlaunch, preflight, script_job, write_spec
from .loadfactor import limit
from .procs import job_pids, job_pids_left
from .test_preflight import PF, assert_only, base_spec, fails, fake_llamafactory, only

NOWHERE = "192.168.1.99"   # no host of any test has it


def local_spec(tmp_path, **cluster) -> dict:
    spec = script_job(["localhost"], 2, "allreduce.py", [], str(tmp_path / "out"), **cluster)
    spec["preflight"] = dict(PF)
    return spec


def node_pids(hs) -> list[set[int]]:
    return [h.pids() for h in hs.hosts]


def new_pids(hs, before: list[set[int]]) -> list[set[int]]:
    """Each host's processes not in before. sshd's session of a launcher's login ends only
    after the launcher closed its side, so what is new is given a moment (scaled to the
    machine's load) to end before it counts as left."""
    deadline = time.monotonic() + limit(10)
    while True:
        new = [now - b for now, b in zip(node_pids(hs), before)]
        if not any(new) or time.monotonic() > deadline:
            return new
        time.sleep(0.1)


# --------------------------------------------------------------------------------------
# 1. master_addr
# --------------------------------------------------------------------------------------

def test_master_addr_not_on_localhost_refuses_submit_and_starts_nothing(tmp_path):
    """The review's case: hosts [localhost], master_addr 10.0.0.9; torchrun would retry the
    store at 10.0.0.9 for 15 minutes. submit now stops at preflight, exit 2."""
    spec = local_spec(tmp_path, master_addr="10.0.0.9")
    r = mlaunch("submit", write_spec(tmp_path, spec), "--run-id", "rv-master-local", timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "preflight failed" in r.stderr and "Traceback" not in r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "network/master-addr on node0" in ln)
    assert line.startswith("[mlaunch] ✗ network/master-addr on node0 localhost: cluster.master_addr: 10.0.0.9 "
                           "is not an address of node 0 (localhost: 127.0.0.1"), line
    assert ("[mlaunch]     fix: set it to one of them, or leave it out (mlaunch then uses hosts[0], localhost, "
            "which must resolve to node 0 on every node)") in r.stdout
    assert "ready rank" not in r.stdout and "sum" not in r.stdout
    assert job_pids_left("rv-master-local", limit(10)) == set()
    assert not os.path.exists(tmp_path / "out")   # output_dir untouched


def test_master_addr_on_localhost_left_out_or_loopback_passes(tmp_path):
    for extra in ({}, {"master_addr": "127.0.0.1"}, {"master_addr": "localhost"}):
        report = preflight(local_spec(tmp_path, **extra))
        row = only(report, "network/master-addr", 0)
        assert row.status == "pass", (extra, report.table())
        assert row.detail.endswith(": node 0's own address"), row
        assert fails(report) == set(), report.table()


def test_master_addr_that_does_not_resolve_on_node0(tmp_path):
    report = preflight(local_spec(tmp_path, master_addr="no-such-master.invalid"))
    row = only(report, "network/master-addr", 0)
    assert row.status == "fail"
    assert row.detail.startswith("cluster.master_addr: no-such-master.invalid does not resolve on node 0 ("), row
    assert "; the addresses of node 0 (localhost: 127.0.0.1" in row.detail, row
    assert row.fix.startswith("set it to one of them, or leave it out"), row


@pytest.mark.multihost
def test_master_addr_of_no_host_refused_on_two_hosts(make_hostset, tmp_path):
    with make_hostset(2, isolated_home=True) as hs:
        ip0 = hs.hosts[0].ip
        # node 0's own address, given explicitly: everything passes
        good = preflight(base_spec(hs, tmp_path, master_addr=ip0))
        assert_only(good, set())
        assert only(good, "network/master-addr", 0).detail == f"{ip0}: node 0's own address"
        # an address no host has: node 0's row names its real addresses
        spec = base_spec(hs, tmp_path, master_addr=NOWHERE)
        report = preflight(spec)
        assert ("network/master-addr", 0) in fails(report), report.table()
        row = only(report, "network/master-addr", 0)
        assert row.detail.startswith(f"cluster.master_addr: {NOWHERE} is not an address of node 0 "
                                     f"({ip0}: 127.0.0.1, {ip0}"), row
        assert row.fix == (f"set it to one of them, or leave it out (mlaunch then uses hosts[0], {ip0}, "
                           "which must resolve to node 0 on every node)")
        # whatever 192.168.1.99 does here, no node reached node 0's listener through it
        for r in (0, 1):
            assert only(report, "network/port-reachable", r).status == "fail", report.table()
        # submit: exit 2, and no process was left on either host
        before = node_pids(hs)
        r = mlaunch("submit", write_spec(tmp_path, spec), "--run-id", "rv-master-2", timeout=300)
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"cluster.master_addr: {NOWHERE} is not an address of node 0" in r.stdout
        assert "ready rank" not in r.stdout
        assert new_pids(hs, before) == [set(), set()], before
        assert job_pids_left("rv-master-2", limit(10)) == set()


@pytest.mark.multihost
def test_master_addr_through_nat_to_node0_passes(make_hostset, tmp_path):
    """A master_addr that is not on node 0's interfaces but leads to it (DNAT on both nodes,
    like a floating IP): node 0's own listener answered there, so it is node 0."""
    vip = "10.254.7.7"
    with make_hostset(2, isolated_home=True) as hs:
        ip0 = hs.hosts[0].ip
        rules = ("table ip mlrv {\n chain out {\n  type nat hook output priority -100;\n"
                 f"  ip daddr {vip} dnat to {ip0}\n }}\n}}\n")
        for h in hs.hosts:   # a route for the VIP (routing comes before the nat hook), then the DNAT
            r = h.run(["ip", "route", "add", f"{vip}/32", "dev", "eth0"])
            assert r.returncode == 0, r.stderr
            r = h.run(["nft", "-f", "-"], input=rules)
            assert r.returncode == 0, r.stderr
        report = preflight(base_spec(hs, tmp_path, master_addr=vip))
        assert_only(report, set())
        assert only(report, "network/master-addr", 0).detail == (
            f"{vip} is not on node 0's interfaces, but leads to node 0 (its own listener answered there)")


def test_master_addr_of_another_host_is_still_refused_by_validate(tmp_path):
    spec = script_job(["10.9.0.1", "10.9.0.2"], 1, "allreduce.py", [], str(tmp_path / "out"),
                      master_addr="10.9.0.2")
    with pytest.raises(UserError) as e:
        validate(spec)
    assert any(ln.startswith("cluster.master_addr: 10.9.0.2 is hosts[1], but node rank 0 (10.9.0.1) runs "
                             "the rendezvous") for ln in e.value.lines()), e.value.lines()


def test_own_address_binds_only_local_addresses():
    assert own_address("127.0.0.1") == {"addrs": ["127.0.0.1"], "own": ["127.0.0.1"]}
    assert own_address("192.0.2.250")["own"] == []         # TEST-NET-1, not on this machine
    assert "error" in own_address("no-such-master.invalid")


# --------------------------------------------------------------------------------------
# 2. misspelt datasets
# --------------------------------------------------------------------------------------

def lf_spec(tmp_path, dataset: str, infos: dict, hosts=("localhost",), hs=None) -> dict:
    """A LLaMA-Factory job (a stand-in llamafactory dist: the software check reads versions
    only) whose dataset_dir lists infos."""
    data, model = tmp_path / "data", tmp_path / "model"
    data.mkdir(exist_ok=True)
    model.mkdir(exist_ok=True)
    (data / "dataset_info.json").write_text(json.dumps(infos))
    for entry in infos.values():
        (data / entry["file_name"]).write_text("[]")
    if hs is not None:
        spec = base_spec(hs, tmp_path)
    else:
        spec = script_job(list(hosts), 1, "allreduce.py", [], str(tmp_path / "out"))
        spec["preflight"] = dict(PF)
    spec["cluster"].setdefault("env", {})["PYTHONPATH"] = fake_llamafactory(tmp_path)
    spec.pop("script")
    spec.update({"trainer": "llamafactory", "model": str(model), "template": "qwen",
                 "dataset": dataset, "dataset_dir": str(data), "cutoff_len": 64,
                 "finetuning": {"type": "lora"}, "batch": {"per_device": 1},
                 "training": {"learning_rate": 1e-4, "max_steps": 10}})
    return spec


INFOS = {"tiny_alpaca": {"file_name": "tiny_alpaca.json"}, "identity": {"file_name": "identity.json"}}


def test_misspelt_dataset_name_says_did_you_mean(tmp_path):
    report = preflight(lf_spec(tmp_path, "tiny_alpacca", INFOS))
    row = only(report, "storage/inputs", 0)
    assert row.status == "fail"
    assert row.detail == f"dataset: tiny_alpacca not listed in {tmp_path}/data/dataset_info.json"
    assert row.fix == "did you mean 'tiny_alpaca'? (fix `dataset` in the spec)"
    assert "copy" not in row.fix


def test_unknown_dataset_name_lists_what_dataset_info_has(tmp_path):
    infos = {**INFOS, **{f"set{i}": {"file_name": f"set{i}.json"} for i in range(10)}}
    report = preflight(lf_spec(tmp_path, "identity,zzz,tiny_alpacca", infos))
    row = only(report, "storage/inputs", 0)
    info = f"{tmp_path}/data/dataset_info.json"
    assert row.detail == f"dataset: zzz, tiny_alpacca not listed in {info}"
    assert row.fix == (f"'zzz': {info} lists tiny_alpaca, identity, set0, set1, set2, set3, set4, set5, "
                       "… (12 in all): set `dataset` to one of those, or add an entry for 'zzz' to it; "
                       "'tiny_alpacca': did you mean 'tiny_alpaca'? (fix `dataset` in the spec)")


def test_misspelt_dataset_dir_says_did_you_mean(tmp_path):
    spec = lf_spec(tmp_path, "tiny_alpaca", INFOS)
    spec["dataset_dir"] = str(tmp_path / "dat")
    row = only(preflight(spec), "storage/inputs", 0)
    assert row.detail == f"dataset: dataset_dir {tmp_path}/dat: no such directory"
    assert row.fix == f"did you mean '{tmp_path}/data'? (fix `dataset_dir` in the spec)"


def test_misspelt_swift_dataset_path_says_did_you_mean(tmp_path):
    """ms-swift's datasets are hub ids or local files: a local file with a typo."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "tiny_alpaca.json").write_text("[]")
    (tmp_path / "model").mkdir()
    spec = {"name": "t", "trainer": "swift",
            "cluster": {"hosts": ["localhost"], "gpus_per_node": 1, "python": sys.executable},
            "model": str(tmp_path / "model"), "model_type": "qwen2", "template": "qwen",
            "dataset": [str(data / "tiny_alpacca.json") + "#32"], "max_length": 64,
            "finetuning": {"type": "lora"}, "batch": {"per_device": 1},
            "training": {"learning_rate": 1e-4, "max_steps": 2},
            "output_dir": str(tmp_path / "out"), "preflight": dict(PF)}
    row = only(preflight(spec), "storage/inputs", 0)
    assert row.detail == f"dataset: {data}/tiny_alpacca.json: no such file or directory", row
    assert row.fix == f"did you mean '{data}/tiny_alpaca.json'? (fix `dataset` in the spec)"


@pytest.mark.multihost
def test_dataset_listed_on_one_node_only_keeps_copy_advice(make_hostset, tmp_path):
    """node1's dataset_info.json is an older copy without the name: the name is right, the
    copy is stale, so the fix is to copy (no "did you mean" though a close name exists)."""
    with make_hostset(2, isolated_home=True) as hs:
        spec = lf_spec(tmp_path, "tiny_alpaca_v2", {**INFOS, "tiny_alpaca_v2": {"file_name": "v2.json"}},
                       hs=hs)
        data = spec["dataset_dir"]
        old = tmp_path / "old"
        old.mkdir()
        (old / "dataset_info.json").write_text(json.dumps(INFOS))
        r = hs.hosts[1].in_mounts(["mount", "--bind", str(old), data])
        assert r.returncode == 0, r.stderr
        report = preflight(spec)
        assert_only(report, {("storage/inputs", 1)})
        row = only(report, "storage/inputs", 1)
        assert row.detail == f"dataset: tiny_alpaca_v2 not listed in {data}/dataset_info.json"
        assert row.fix.startswith(f"copy the dataset directory {data} (with dataset_info.json and its files) "
                                  f"to {hs.hosts[1].ip}"), row.fix


@pytest.mark.parametrize("error", ["PermissionError: [Errno 13] Permission denied: '/data/m'",
                                   "no answer within 8s (hung mount or driver?)"])
def test_an_input_check_that_crashed_or_hung_fails_the_row(error):
    """A node that answered, but whose input check crashed or timed out, has unverified inputs:
    a ✗ with the error and a fix, never a – that lets submit go on."""
    from launcher.preflight import storage
    from launcher.preflight.report import Report
    from .test_preflight import ctx_for
    ctx = ctx_for(["a", "b"])
    facts = {0: {"inputs": [{"what": "script", "path": "x.py", "ok": True}]}, 1: {"inputs": {"error": error}}}
    rows = storage.check_inputs(ctx, facts)
    assert [r.status for r in rows] == ["pass", "fail"]
    assert error in rows[1].detail and "on b by hand" in rows[1].fix
    assert not Report(tuple(rows), 0.0).ok
    # a node with no facts at all is another row's failure (SSH, python): a skip here
    assert storage.check_inputs(ctx, {0: facts[0]})[1].status == "skip"

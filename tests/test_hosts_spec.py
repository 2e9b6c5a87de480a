"""Host strings, encodings, DeepSpeed hostfiles (mixed slots, max_slots, include/exclude,
first_nodes, case) and the error cap: each case with its error text (issue 11 §2-4, §7)."""
from __future__ import annotations

import json
import os
import posixpath
import re

import pytest
import yaml

from launcher.errors import Problem, SpecError, UserError
from launcher.plan.launch_plan import build_plan
from launcher.view.present import describe_plan
from launcher.spec import hosts as hosts_mod
from launcher.spec import load_spec, validate
from launcher.spec.hosts import HostAddr, parse_host

from .helpers import mlaunch, seed000, write_spec


def script_spec(hosts, procs=1, **cluster) -> dict:
    return {"name": "t", "trainer": "script", "script": {"path": "/abs/train.py"},
            "cluster": {"hosts": hosts, "gpus_per_node": procs, **cluster}}


def problems(data: dict) -> list[str]:
    with pytest.raises(SpecError) as err:
        validate(data)
    return [str(p) for p in err.value.problems]


def load_problems(path: str) -> list[str]:
    with pytest.raises(SpecError) as err:
        load_spec(path)
    return [str(p) for p in err.value.problems]


def hostfile_job(tmp_path, text: str | bytes, **cluster) -> str:
    """A script job over a hostfile with `text`; the spec's path."""
    hf = tmp_path / "hosts"
    hf.write_bytes(text if isinstance(text, bytes) else text.encode())
    spec = {"name": "t", "trainer": "script", "script": {"path": "/abs/train.py"},
            "cluster": {"hostfile": "hosts", **cluster}}
    return write_spec(tmp_path, spec)


# --- §2 host strings ------------------------------------------------------------------------

@pytest.mark.parametrize("text,want", [
    ("node1", HostAddr("node1")),
    ("train@node1", HostAddr("node1", "train")),
    ("node1:2222", HostAddr("node1", None, 2222)),
    ("train@10.0.0.1:2222", HostAddr("10.0.0.1", "train", 2222)),
    ("[::1]:22", HostAddr("::1", None, 22)),
    ("root@[fe80::1]", HostAddr("fe80::1", "root")),
    ("fe80::1", HostAddr("fe80::1")),
])
def test_host_string_forms(text, want):
    assert parse_host(text) == want


@pytest.mark.parametrize("text,error", [
    ("a b", "'a b' is not a host name or address"),
    ("@node1", "'@node1': '' is not a user name"),
    ("node1:0", "'node1:0': port '0' is not 1-65535"),
    ("node1:99999", "'node1:99999': port '99999' is not 1-65535"),
    ("node1:ssh", "'node1:ssh': port 'ssh' is not 1-65535"),
    ("[10.0.0.1]:22", "'[10.0.0.1]:22': [10.0.0.1] is not an IPv6 address"),
    ("node1;reboot", "'node1;reboot' is not a host name or address"),
])
def test_bad_host_strings(text, error):
    assert problems(script_spec([text])) == [
        f"cluster.hosts[0]: {error}; give host, user@host, host:port, user@host:port or [v6addr]:port"]


def test_user_and_port_go_to_ssh_only():
    job = validate(script_spec(["train@node1:2222", "node2", "ops@node3"]))
    plan = build_plan(job, run_id="R")
    n0, n1, n2 = plan.nodes
    assert (n0.host, n0.login) == ("node1", "train@node1:2222")
    assert (n1.host, n1.login) == ("node2", "node2")
    assert (n2.host, n2.login) == ("node3", "ops@node3")
    for n in plan.nodes:
        assert n.argv[n.argv.index("--master-addr") + 1] == "node1"
        assert "@" not in n.log_path and ":2222" not in n.log_path
    text = describe_plan(plan)
    assert "\nnode 0: node1 (ssh train@node1:2222)\n" in text
    assert "\n  hosts: node2 (ssh node2:22), node3 (ssh ops@node3:22)\n" in text
    full = describe_plan(plan, full=True)
    assert "=== node 0: node1 (ssh train@node1:2222) ===" in full
    assert "=== node 1: node2 (ssh node2:22) ===" in full
    assert "=== node 2: node3 (ssh ops@node3:22) ===" in full


def test_host_user_contradicting_ssh_user():
    data = script_spec(["root@node1", "node2"], ssh={"user": "train"})
    assert problems(data) == ["cluster.hosts[0]: 'root@node1' says user root but cluster.ssh.user is "
                              "train; remove one (per-host users need cluster.ssh.user unset)"]
    data["cluster"]["hosts"] = ["train@node1", "node2"]  # agreeing is fine
    assert validate(data).cluster.hosts[0] == "train@node1"


def test_host_port_contradicting_ssh_port():
    data = script_spec(["node1:2222", "node2"], ssh={"port": 22})
    assert problems(data) == ["cluster.hosts[0]: 'node1:2222' says port 2222 but cluster.ssh.port is "
                              "22; remove one (per-host ports need cluster.ssh.port unset)"]


def test_ssh_connection_gets_host_user_port_apart():
    """fabric raised "You supplied the user via both shorthand and kwarg!" for this case."""
    from launcher.transport.ssh import SSHExecutor
    from launcher.spec import SSH
    ex = SSHExecutor(["train@node1:2222", "node2"], SSH(user="train"))
    c = ex._connection("train@node1:2222")
    assert (c.host, c.user, c.port) == ("node1", "train", 2222)
    c2 = ex._connection("node2")
    assert (c2.host, c2.user) == ("node2", "train")


def test_same_host_other_port_is_another_machine():
    # Two sshds on one name (two containers) are two machines: no duplicate-host error.
    validate(script_spec(["node1:2222", "node1:2223"]))
    # The same sshd reached twice is one machine: the duplicate rule applies.
    assert problems(script_spec(["node1", "node1:22"]))[0].startswith(
        "cluster.hosts: node1 / node1:22 listed 2 times: nodes on one host need their own GPUs")


def test_host_names_differing_in_case_are_duplicates():
    assert problems(script_spec(["Node1", "node1"]))[0].startswith(
        "cluster.hosts: Node1 / node1 listed 2 times: nodes on one host need their own GPUs")


@pytest.mark.parametrize("addr", ["10.0.0.1 && curl x", "train@node1", "node1:29500", "$(id)"])
def test_master_addr_must_be_a_name_or_address(addr):
    lines = problems(script_spec(["node1", "node2"], master_addr=addr))
    assert lines == [f"cluster.master_addr: {addr!r} is not a host name or IP address; give node 0's "
                     "address only (no user@ or :port; the port is cluster.master_port)"]


def test_master_addr_matches_hosts_by_name_ignoring_case():
    validate(script_spec(["train@Node1:2222", "node2"], master_addr="node1"))
    assert problems(script_spec(["node1", "node2:2222"], master_addr="NODE2"))[0].startswith(
        "cluster.master_addr: NODE2 is hosts[1], but node rank 0 (node1) runs the rendezvous")


def test_relative_output_dir_refused_on_several_machines():
    data = script_spec(["node1", "node2"])
    data["output_dir"] = "out"
    assert problems(data) == [
        "output_dir: 'out' is relative: each of the 2 machines would resolve it against its own "
        "working directory (the ssh user's home), scattering the checkpoints; give an absolute path "
        "on storage every node sees, e.g. /mnt/shared/out, or an absolute cluster.workdir it "
        "resolves in"]
    data["output_dir"] = "/srv/work/out"
    validate(data)
    one = script_spec(["localhost", "127.0.0.1"], cuda_visible_devices=[[0], [1]])
    one["output_dir"] = "out"  # one machine: every node resolves it the same way
    validate(one)


def test_relative_output_dir_resolves_in_workdir_and_says_where():
    """Every node cd's to an absolute workdir first, so a relative output_dir is one path."""
    data = script_spec(["node1", "node2"], workdir="/srv/work")
    data["output_dir"] = "out"
    job = validate(data)
    note = ("note: output_dir 'out' is relative: every node resolves it in cluster.workdir, as "
            "/srv/work/out; that directory must be shared storage")
    assert note in describe_plan(build_plan(job, run_id="R")).splitlines()


# --- §3 encodings and other unreadable input -------------------------------------------------

def cli_error(tmp_path, spec_path: str) -> list[str]:
    r = mlaunch("validate", spec_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    return r.stderr.splitlines()


def test_spec_not_utf8(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_bytes(b"name: t\n# caf\xe9\n")
    assert cli_error(tmp_path, str(p)) == [
        f"mlaunch: {p}: not UTF-8 text: byte 0xe9 at offset 13; save the spec as UTF-8"]


def test_spec_utf16(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_bytes("name: t\n".encode("utf-16"))
    assert cli_error(tmp_path, str(p)) == [
        f"mlaunch: {p}: not UTF-8 text: byte 0xff at offset 0; save the spec as UTF-8"]


def test_hostfile_not_utf8(tmp_path):
    path = hostfile_job(tmp_path, b"node1 slots=1\nn\xf6de2 slots=1\n")
    hf = tmp_path / "hosts"
    assert cli_error(tmp_path, path) == [
        f"mlaunch: {path}: invalid job spec",
        f"mlaunch: cluster.hostfile: {hf}: not UTF-8 text: byte 0xf6 at offset 15; save the "
        "hostfile as UTF-8"]


@pytest.mark.parametrize("content,line", [
    (b"", "the spec is empty; expected a mapping of fields (name:, cluster:, trainer:, ...) at the top level"),
    (b"- a\n- b\n", "the spec is a YAML list; expected a mapping of fields"),
    (b"just text\n", "the spec is a YAML str; expected a mapping of fields"),
    (b"name: t\x00\x01\n", "character U+0000 at character offset 7 is not allowed in YAML; is this a binary file?"),
    (b"[" * 5000, None),
])
def test_unusable_spec_text(tmp_path, content, line):
    p = tmp_path / "job.yaml"
    p.write_bytes(content)
    lines = cli_error(tmp_path, str(p))
    assert len(lines) == 1 and lines[0].startswith(f"mlaunch: {p}")
    if line:
        assert line in lines[0]


def test_spec_path_is_a_directory_or_missing(tmp_path):
    r = mlaunch("validate", str(tmp_path))
    assert r.returncode == 2 and "a directory, not a job spec file" in r.stderr
    assert "Traceback" not in r.stderr
    r = mlaunch("validate", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"mlaunch: {tmp_path / 'nope.yaml'}: cannot read the spec: No such file or directory; give the path of a readable YAML file"


def test_hostfile_missing_or_a_directory(tmp_path):
    spec = {"name": "t", "trainer": "script", "script": {"path": "/abs/train.py"},
            "cluster": {"hostfile": "missing.txt"}}
    path = write_spec(tmp_path, spec)
    assert cli_error(tmp_path, path)[1] == (f"mlaunch: cluster.hostfile: {tmp_path / 'missing.txt'}: "
                                            "cannot read the hostfile: No such file or directory; give the path of a readable "
                                            "file (a relative one is taken from the spec's folder)")
    os.mkdir(tmp_path / "hd")
    spec["cluster"]["hostfile"] = "hd"
    path = write_spec(tmp_path, spec)
    assert cli_error(tmp_path, path)[1] == (f"mlaunch: cluster.hostfile: {tmp_path / 'hd'}: "
                                            "cannot read the hostfile: Is a directory; give the path of a readable "
                                            "file (a relative one is taken from the spec's folder)")


def test_empty_hostfile(tmp_path):
    path = hostfile_job(tmp_path, "# nothing here\n\n")
    assert load_problems(path) == [f"cluster.hostfile: {tmp_path / 'hosts'} lists no hosts"]


# --- §4 DeepSpeed hostfiles ------------------------------------------------------------------

def test_mixed_slots_per_node_counts(tmp_path):
    path = hostfile_job(tmp_path, "worker-0 slots=2\nworker-1 slots=1\n")
    job = load_spec(path)
    assert job.cluster.gpus_per_node == [2, 1]
    plan = build_plan(job, run_id="R")
    assert [n.argv[n.argv.index("--nproc-per-node") + 1] for n in plan.nodes] == ["2", "1"]
    text = describe_plan(plan)
    assert "world: 2 nodes: 2+1 = 3 processes\n" in text
    r = mlaunch("validate", path)
    assert r.returncode == 0 and r.stdout.endswith("ok (script, 2 nodes: 2+1 = 3 processes)\n")


def test_mixed_slots_batch_and_ds_config(tmp_path):
    (tmp_path / "hosts").write_text("a slots=2\nb slots=1\n")
    data = seed000()
    for k in ("hosts", "gpus_per_node", "master_addr"):
        data["cluster"].pop(k)
    data["cluster"]["hostfile"] = "hosts"
    data["batch"] = {"per_device": 2, "grad_accum": 4, "global": 32}
    assert load_problems(write_spec(tmp_path, data)) == [
        "batch.global: 32 ≠ 3 GPUs (2+1 on 2 nodes) × 2 per device × 4 accumulation = 24; set global to "
        "24, change per_device/grad_accum, or omit global"]
    data["batch"]["global"] = 24
    plan = build_plan(load_spec(write_spec(tmp_path, data)), run_id="R")
    files = {posixpath.basename(f.path): f.content for f in plan.files}
    ds = json.loads(files["ds_config.json"])
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"],
            ds["gradient_accumulation_steps"]) == (24, 2, 4)
    lf = yaml.safe_load(files["llamafactory.yaml"])
    assert (lf["per_device_train_batch_size"], lf["gradient_accumulation_steps"]) == (2, 4)
    assert "global batch: 24 = 3 GPUs (2+1 on 2 nodes) × 2 per device × 4 accumulation" in describe_plan(plan)


def test_gpus_per_node_as_a_list():
    job = validate(script_spec(["a", "b", "c"], [4, 2, 2]))
    plan = build_plan(job, run_id="R")
    assert [n.argv[n.argv.index("--nproc-per-node") + 1] for n in plan.nodes] == ["4", "2", "2"]
    assert problems(script_spec(["a", "b"], [4, 2, 2])) == [
        "cluster.gpus_per_node: 3 counts for 2 hosts; give one count, or one per host in host order"]
    assert problems(script_spec(["a", "b"], [2, 1], cuda_visible_devices=[0, 1])) == [
        "cluster.cuda_visible_devices: one list for nodes that run different numbers of processes; "
        "give one list per node, e.g. [[0, 1], [0]]"]
    assert problems(script_spec(["a", "b"], [2, 1], cuda_visible_devices=[[0, 1], [0, 1]])) == [
        "cluster.cuda_visible_devices[1]: 2 devices listed but gpus_per_node is 1; list exactly one "
        "device per process"]


def test_preflight_gpu_check_per_node_counts():
    """Each node's GPU check wants its own count: 8 on node 0 (which sees 4), 2 on node 1."""
    from launcher.preflight import gpu

    from .test_preflight import ctx_for, gpu_facts
    ctx = ctx_for(["a", "b"], gpus_per_node=[8, 2])
    assert (gpu.wanted(ctx, 0), gpu.wanted(ctx, 1)) == (list(range(8)), [0, 1])
    rows = {r.node: r for r in gpu.check(ctx, {0: gpu_facts(), 1: gpu_facts()})}
    assert rows[0].detail == "sees 4 GPU(s), the job uses 8 (missing index 4, 5, 6, 7)"
    assert rows[0].fix == ("run at most 4 processes on a (cluster.gpus_per_node or its hostfile slots=), "
                           "or set cluster.cuda_visible_devices to GPUs that exist")
    assert rows[1].status == "pass"


def test_hostfile_slots_against_gpus_per_node(tmp_path):
    assert load_problems(hostfile_job(tmp_path, "a slots=2\nb slots=1\n", gpus_per_node=2)) == [
        "cluster.gpus_per_node: 2 but the hostfile says slots=1; remove gpus_per_node (the slots "
        "give it) or make them agree"]
    assert load_problems(hostfile_job(tmp_path, "a slots=2\nb\n")) == [
        "cluster.gpus_per_node: required: the hostfile line of b has no slots=N; add slots= to "
        "every line, or give gpus_per_node"]
    assert load_spec(hostfile_job(tmp_path, "a slots=2\nb\n", gpus_per_node=2)).cluster.gpus_per_node == 2
    assert load_problems(hostfile_job(tmp_path, "a slots=2\nb slots=1\n", gpus_per_node=[1, 1])) == [
        "cluster.gpus_per_node: [1, 1] but the hostfile's slots are [2, 1]; remove gpus_per_node "
        "(the slots give it)"]


def test_openmpi_max_slots_read_past_and_said(tmp_path):
    path = hostfile_job(tmp_path, "a slots=4 max_slots=4\nb slots = 4 max_slots=8\n")
    job = load_spec(path)
    assert job.cluster.gpus_per_node == 4
    note = "hostfile hosts: max_slots= ignored on lines 1, 2; mlaunch reads only slots="
    assert f"note: {note}\n" in describe_plan(build_plan(job, run_id="R"))
    assert f"note: {note}\n" in mlaunch("validate", path).stdout


@pytest.mark.parametrize("line,error", [
    ("a slots=4 garbage", "expected `host slots=N`, got 'a slots=4 garbage'"),
    ("a slots=x", "expected `host slots=N`, got 'a slots=x'"),
    ("a slots=0", "a slots=0: a node runs at least one process; remove the line or exclude the host"),
])
def test_bad_hostfile_lines(tmp_path, line, error):
    assert load_problems(hostfile_job(tmp_path, line + "\n")) == [f"{tmp_path / 'hosts'}:1: {error}"]


def test_hostfile_user_and_port_forms(tmp_path):
    job = load_spec(hostfile_job(tmp_path, "train@gpu-a:2222 slots=2\n[fd00::2]:22 slots=1\n"))
    plan = build_plan(job, run_id="R")
    assert [(n.host, n.login) for n in plan.nodes] == [("gpu-a", "train@gpu-a:2222"),
                                                        ("fd00::2", "[fd00::2]:22")]


POOL = "worker-0 slots=4\nworker-1 slots=2\nworker-2 slots=4\n"


def selected(tmp_path, **cluster):
    job = load_spec(hostfile_job(tmp_path, POOL, **cluster))
    c = job.cluster
    return c.hosts, c.gpus_per_node, c.cuda_visible_devices, job


def test_include_hosts_and_slots(tmp_path):
    hosts, procs, devs, job = selected(tmp_path, include="worker-1@worker-0:0,2")
    assert (hosts, procs, devs) == (["worker-0", "worker-1"], 2, [[0, 2], [0, 1]])
    plan = build_plan(job, run_id="R")
    assert dict(plan.nodes[0].env)["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert ("note: include 'worker-1@worker-0:0,2': 2 of 3 hosts, 4 slots; kept slots become "
            "CUDA_VISIBLE_DEVICES") in describe_plan(plan)


def test_exclude_hosts_and_slots(tmp_path):
    hosts, procs, devs, _ = selected(tmp_path, exclude="worker-1:0@worker-2")
    assert (hosts, procs, devs) == (["worker-0", "worker-1"], [4, 1], [[0, 1, 2, 3], [1]])


def test_include_ignores_case(tmp_path):
    assert selected(tmp_path, include="WORKER-2:3")[:3] == (["worker-2"], 1, [[3]])


def test_first_nodes(tmp_path):
    hosts, procs, devs, job = selected(tmp_path, first_nodes=2)
    assert (hosts, procs, devs) == (["worker-0", "worker-1"], [4, 2], None)
    assert "note: first_nodes 2: 2 of 3 hosts (worker-0 … worker-1)" in describe_plan(build_plan(job, run_id="R"))


@pytest.mark.parametrize("cluster,error", [
    ({"include": "worker-0", "exclude": "worker-1"},
     "cluster.include: include and exclude cannot be combined (as deepspeed -i/-e); keep one"),
    ({"include": "worker-0", "first_nodes": 1},
     "cluster.first_nodes: cannot be combined with include/exclude (as deepspeed --num_nodes); keep one"),
    ({"include": "worker-9"}, "cluster.include: host 'worker-9' is not in cluster.hosts/hostfile"),
    ({"exclude": "worker-1:2"}, "cluster.exclude: worker-1 has slots 0-1; there is no slot 2"),
    ({"include": "worker-0:a"}, "cluster.include: 'worker-0:a' in 'worker-0:a': expected NAME or "
     "NAME:SLOT,SLOT (hosts joined by @, e.g. worker-0:0,2@worker-1)"),
    ({"exclude": "worker-0@worker-1@worker-2"},
     "cluster.exclude: 'worker-0@worker-1@worker-2' leaves no host; keep at least one slot"),
    ({"include": "worker-0", "cuda_visible_devices": [[0], [1], [2]]},
     "cluster.cuda_visible_devices: give cuda_visible_devices or include/exclude, not both: the slots "
     "include/exclude keep become each node's CUDA_VISIBLE_DEVICES"),
    ({"first_nodes": 4}, "cluster.first_nodes: 4 but only 3 hosts are listed; use at most 3"),
])
def test_selection_errors(tmp_path, cluster, error):
    assert load_problems(hostfile_job(tmp_path, POOL, **cluster)) == [error]


def test_include_of_a_host_listed_twice(tmp_path):
    data = script_spec(["a:22", "a:2222", "b"], 1, include="a")  # two sshds on one name
    assert problems(data) == ["cluster.include: a is listed 2 times (nodes 0, 1); include/exclude "
                              "pick hosts by name, so list each host once"]


def test_selection_revalidates_unchanged(tmp_path):
    """The preflight all-reduce re-validates the loaded cluster: the selection must not apply twice."""
    _, _, _, job = selected(tmp_path, exclude="worker-1:0")
    dump = job.cluster.model_dump(mode="json", exclude_unset=True, by_alias=True)
    dump.pop("hostfile")
    again = validate(script_spec(**{"hosts": dump.pop("hosts"), "procs": dump.pop("gpus_per_node")},
                                 **dump))
    assert (again.cluster.hosts, again.cluster.gpus_per_node, again.cluster.cuda_visible_devices) == (
        job.cluster.hosts, job.cluster.gpus_per_node, job.cluster.cuda_visible_devices)


# --- §7 scale and the error cap -------------------------------------------------------------

def test_error_output_capped_at_20(tmp_path):
    err = UserError([Problem(f"p{i}", "bad") for i in range(25)], header="head")
    assert err.lines() == ["head"] + [f"p{i}: bad" for i in range(20)] + ["… and 5 more problems (25 in all)"]
    assert len(err.lines(limit=None)) == 26
    path = hostfile_job(tmp_path, "".join(f"node{i} slots=x\n" for i in range(10000)))
    lines = cli_error(tmp_path, path)
    assert len(lines) == 22
    assert lines[1] == f"mlaunch: {tmp_path / 'hosts'}:1: expected `host slots=N`, got 'node0 slots=x'"
    assert lines[-1] == "mlaunch: … and 9980 more problems (10000 in all)"


def test_validation_work_is_linear_in_hosts(tmp_path, monkeypatch):
    """Host strings are parsed a fixed number of times per host, and duplicates are still found."""
    calls = []
    real = hosts_mod.parse_host
    monkeypatch.setattr(hosts_mod, "parse_host", lambda t: calls.append(1) or real(t))
    counts = []
    for n in (1000, 4000):
        calls.clear()
        names = [f"node{i}" for i in range(n)]
        names[-1] = "NODE7"  # a duplicate, by case, at the far end
        lines = problems(script_spec(names))
        assert lines == ["cluster.hosts: node7 / NODE7 listed 2 times: nodes on one host need their own "
                         "GPUs; give cuda_visible_devices one list per node of gpus_per_node (1) GPUs, "
                         "e.g. [[0], [1]], or list the host once"]
        counts.append(len(calls))
    assert counts[1] == 4 * counts[0]


# --- on real hosts: 2 processes on one node, 1 on the other, through SSH ---------------------

@pytest.mark.multihost
def test_mixed_slots_allreduce_on_hosts(make_hostset, tmp_path):
    """A DeepSpeed hostfile with slots 2 and 1, one host as user@ip, the other as ip:port."""
    from .test_fanout import check_allreduce, submit
    from .helpers import script_job
    with make_hostset(2) as hs:
        a, b = hs.hosts
        (tmp_path / "hosts").write_text(f"root@{a.ip} slots=2 max_slots=2\n{b.ip}:22 slots=1\n")
        out = str(tmp_path / "out")
        spec = script_job([], 1, "allreduce.py", [], out,
                          ssh={"key_file": hs.key_file, "known_hosts": hs.known_hosts, "connect_timeout": 3})
        c = spec["cluster"]
        c.pop("hosts"), c.pop("gpus_per_node")
        c["hostfile"] = str(tmp_path / "hosts")
        r = submit(tmp_path, spec, timeout=240)
        check_allreduce(r, 3, 2, out)
        ranks = {(int(k), int(n)) for k, n in re.findall(r"rank (\d+)/3 node (\d+) sum 3", r.stdout)}
        assert ranks == {(0, 0), (1, 0), (2, 1)}  # contiguous: node 0 holds ranks 0-1
        assert re.search(rf"^\[node0 {a.ip} local1\] rank 1/3 node 0", r.stdout, re.M)
        assert f"@{a.ip}" not in r.stdout and f"{b.ip}:22" not in r.stdout  # host names only
        # The preflight all-reduce covers the same 3 ranks through the same fan-out.
        chk = mlaunch("check", write_spec(tmp_path, spec), "--json", timeout=240)
        assert chk.returncode == 0, chk.stdout[-3000:] + chk.stderr
        rows = {(x["check"], x["node"]): x for x in json.loads(chk.stdout)["results"]}
        assert rows[("collective", None)]["status"] == "pass"
        assert "3 ranks" in rows[("collective", None)]["detail"]

        # exclude slot 0 of the first host: it runs 1 process on CUDA_VISIBLE_DEVICES=1.
        c["exclude"] = f"{a.ip}:0"
        out2 = str(tmp_path / "out2")
        spec["output_dir"] = out2
        r = submit(tmp_path, spec, timeout=240)
        check_allreduce(r, 2, 2, out2)
        assert re.search(r"rank 0/2 node 0 sum 1 expected 1 devices 1$", r.stdout, re.M)
        assert re.search(r"rank 1/2 node 1 sum 1 expected 1 devices 0$", r.stdout, re.M)


@pytest.mark.multihost
@pytest.mark.training
def test_llamafactory_zero2_on_2_plus_1_processes(make_hostset, tmp_path):
    """Real LLaMA-Factory + DeepSpeed ZeRO-2 over a hostfile with slots 2 and 1: DeepSpeed
    accepts the rendered train_batch_size (it checks micro × accumulation × world), the
    trainer reports the global batch 3 × 2 = 6, and each of the 3 ranks saves its shard."""
    from .training import build_tiny, lf_spec, submit_timed, trainer_state
    tiny = build_tiny(str(tmp_path / "tiny"))
    out = str(tmp_path / "out")
    with make_hostset(2) as hs:
        a, b = hs.hosts
        (tmp_path / "hosts").write_text(f"{a.ip} slots=2\n{b.ip} slots=1\n")
        spec = lf_spec(tiny, [], 1, out, hs=hs, deepspeed={"stage": 2}, max_steps=4, save_steps=2)
        c = spec["cluster"]
        c.pop("hosts"), c.pop("gpus_per_node")
        c["hostfile"] = str(tmp_path / "hosts")
        spec["batch"]["global"] = 6
        r = submit_timed(tmp_path, spec)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "Total train batch size (w. parallel, distributed & accumulation) = 6" in r.stdout
    assert trainer_state(out)["global_step"] == 4
    shards = os.listdir(os.path.join(out, "checkpoint-2", "global_step2"))
    assert len([s for s in shards if s.endswith("optim_states.pt")]) == 3, shards


def test_yaml_alias_bomb_is_one_line_per_key(tmp_path):
    """Nine nine-fold nested aliases ("billion laughs"): refused in one line as the YAML is
    read (issue 51: aliases are bounded, spec/inputs.py), never walked 9^9 times."""
    lines = ["name: t", "cluster: {hosts: [a], gpus_per_node: 1}", "trainer: script",
             "script: {path: /x}", 'a0: &a0 ["lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    p = tmp_path / "job.yaml"
    p.write_text("\n".join(lines) + "\n")
    assert cli_error(tmp_path, str(p)) == [
        f"mlaunch: {p}: YAML aliases (*name) repeat over 100,000 nodes; a job spec needs far "
        "fewer: write the repeated values out or anchor smaller pieces"]


def test_render_into_an_unwritable_place_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("")
    spec = write_spec(tmp_path, script_spec(["localhost"]))
    r = mlaunch("render", spec, "--out", str(tmp_path / "afile" / "x"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr == (f"mlaunch: --out {tmp_path / 'afile' / 'x'}: cannot write "
                        f"{tmp_path / 'afile' / 'x'}: Not a directory; give a directory you can write\n")


def test_dry_run_of_the_mixed_hostfile_example():
    from .helpers import CONFIGS
    r = mlaunch("submit", os.path.join(CONFIGS, "hostfile-mixed-lora.yaml"), "--dry-run")
    assert r.returncode == 0, r.stderr
    head = r.stdout.splitlines()[1:6]
    assert head == [
        "world: 3 nodes: 4+1+2 = 7 processes",
        "note: cluster.hostfile 'hosts-mixed.txt' is relative: mlaunch reads it from the spec's directory",
        "note: hostfile hosts-mixed.txt: max_slots= ignored on line 2; mlaunch reads only slots=",
        "note: exclude 'gpu-b:1': 3 of 3 hosts, 7 slots; kept slots become CUDA_VISIBLE_DEVICES",
        "global batch: 56 = 7 GPUs (4+1+2 on 3 nodes) × 2 per device × 4 accumulation"]
    for title in ("node 0: gpu-a (ssh train@gpu-a:22)\n  processes: 4, GPUs 0,1,2,3 (CUDA_VISIBLE_DEVICES)",
                  "node 1: gpu-b (ssh train@gpu-b:22)\n  processes: 1, GPUs 0 (CUDA_VISIBLE_DEVICES)",
                  "node 2: gpu-c (ssh train@gpu-c:2222)\n  processes: 2, GPUs 0,1 (CUDA_VISIBLE_DEVICES)"):
        assert title in r.stdout
    assert r.stdout.count("--master-addr gpu-a ") == 3
    assert [int(x) for x in re.findall(r"--nproc-per-node (\d+)", r.stdout)] == [4, 1, 2]

"""Preflight (`mlaunch check`) on real namespace+sshd hosts: everything passes on a healthy
pair, then one real fault per check (a bound port, a firewall rule, a hidden dataset, a
node-local "shared" dir, another torch, a wrong interface, a loopback hostname, a tiny
/dev/shm), each giving exactly its ✗ with a concrete fix while every other row stays ✓.
Unit tests of the pure parts (NCCL interface grammar, nvidia-smi parsing, the table) last.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from launcher.session.attempt import JobResult, NodeOutcome
from launcher.transport.base import Exit
from launcher.plan.launch_plan import build_plan
from launcher.preflight import CheckResult, Report
from launcher.cli.check_cmd import check_command
from launcher.preflight import collective, gpu, ifname, network, software, storage
from launcher.preflight.probe import Ctx
from launcher.preflight.runner import ssh_fix
from launcher.spec import validate

from .helpers import mlaunch, preflight, script_job, write_spec
from .loadfactor import limit

# Timeouts scaled to the machine's load: a probe's login and start, or a 2x2 all-reduce's
# torch imports, may take several times longer on two busy cores than on a quiet one.
PF = {"min_free_gb": 0.5, "min_shm_mb": 16, "check_timeout_s": round(limit(10)),
      "collective_timeout_s": round(limit(60)), "collective_mb": 4}
ENV = {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "=eth0"}


def base_spec(hs, tmp_path, nproc: int = 1, **cluster) -> dict:
    """A healthy script job over the hosts: interfaces named, a real shared_dir, small limits."""
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    cluster = {"env": dict(ENV), "shared_dir": str(shared), **cluster}
    spec = script_job([h.ip for h in hs.hosts], nproc, "allreduce.py", [], str(tmp_path / "out"),
                      hs=hs, **cluster)
    spec["preflight"] = dict(PF)
    return spec


def check(spec: dict, fast_only: bool = True) -> Report:
    return preflight(spec, fast_only)


def fails(report: Report) -> set[tuple[str, int | None]]:
    return {(r.check, r.node) for r in report.results if r.status == "fail"}


def assert_only(report: Report, expected: set[tuple[str, int | None]]) -> None:
    """Exactly the expected ✗; everything else ✓, except gpu (no nvidia-smi here): –."""
    assert fails(report) == expected, report.table()
    for r in report.results:
        if (r.check, r.node) not in expected:
            assert r.status == ("skip" if r.check == "gpu" else "pass"), (r, report.table())


def only(report: Report, check_name: str, node: int | None) -> CheckResult:
    r = report.get(check_name, node)
    assert r is not None, report.table()
    return r


# --------------------------------------------------------------------------------------
# real hosts
# --------------------------------------------------------------------------------------

@pytest.mark.multihost
def test_all_pass_two_hosts(make_hostset, tmp_path, capsys):
    # Root's real home: every session first runs ~/.bashrc (pyenv init, ~0.3 s), as on
    # clusters with slow login shells; the clock check must not mistake that for skew.
    with make_hostset(2) as hs:
        path = write_spec(tmp_path, base_spec(hs, tmp_path, nproc=2))
        t0 = time.monotonic()
        rc = check_command(path, as_json=False)
        wall = time.monotonic() - t0
        table = capsys.readouterr().out
        assert rc == 0, table
        assert "✗" not in table and "all checks passed" in table
        for row in ("ssh", "software/python", "software/versions", "network/port-free",
                    "network/hostname", "network/ifname", "storage/shared", "clock", "container/shm"):
            assert re.search(rf"^{re.escape(row)}\s+✓", table, re.M), (row, table)
        assert re.search(r"^gpu\s+–\s+–", table, re.M)
        assert re.search(r"^software/py-spy\s+✓", table, re.M), table   # the hang watchdog's stacks
        m = re.search(r"^collective\s+✓ 4 ranks \(gloo\): correct; 4 MB busbw ([\d.]+) GB/s .* over gloo/tcp$",
                      table, re.M)
        assert m and float(m.group(1)) > 0, table
        # The transport beside it: both nodes' ranks said they ran gloo, which is TCP.
        assert re.search(r"^collective/transport\s+✓ node0,1: gloo/tcp$", table, re.M), table
        with capsys.disabled():
            print(f"\n[preflight] full check (fast checks + 2x2 all-reduce) on 2 hosts: {wall:.1f}s")
        # Nothing left behind: no marker files in shared_dir, no run directory of the all-reduce.
        assert not [f for f in os.listdir(tmp_path / "shared") if f.startswith(".mlaunch-preflight")]
        assert not glob.glob(str(tmp_path / "shared" / ".mlaunch" / "*" / "*"))   # <user>/<run>


@pytest.mark.multihost
def test_forty_hosts_check_their_mesh_all_at_once(make_hostset, tmp_path, monkeypatch):
    """Past 32 nodes (the probes' thread pool once stopped there) every node's mesh listener
    and dialers still run in one window: 40 hosts, every row passes, and each node was
    reached by all 39 others (its hostname row says so). Isolated homes: root's ~/.bashrc here
    (pyenv's init, 0.3 s of CPU a session) on 40 hosts sharing two cores spread the probes'
    starts wider than the mesh's 8 s window, which real nodes, each with its own CPUs, do not."""
    with make_hostset(40, isolated_home=True) as hs:
        spec = base_spec(hs, tmp_path)
        spec["preflight"]["check_timeout_s"] = round(limit(60))   # 40 nodes' probes share 2 cores
        monkeypatch.setattr(network, "MESH_WINDOW_S", limit(network.MESH_WINDOW_S))
        report = check(spec)
    assert_only(report, set())
    rows = [r for r in report.results if r.check == "network/hostname"]
    assert len(rows) == 40 and all(r.detail.endswith("reachable from every node") for r in rows), report.table()


def test_probes_run_on_every_node_at_once():
    """on_nodes starts every node's script before any returns: 40 fake nodes meet at a barrier
    (a pool of 32 would leave 8 waiting and break it)."""
    import threading
    from launcher.preflight.probe import on_nodes
    n = 40
    spec = script_job([f"10.9.{i // 200}.{i % 200 + 1}" for i in range(n)], 1, "x.py", [], "/tmp/out")
    barrier = threading.Barrier(n, timeout=20)

    class Meeting:
        def run(self, login, script, timeout):
            barrier.wait()
            return 0, "MLAUNCH-PREFLIGHT {}"

    outs = on_nodes(Ctx(build_plan(validate(spec)), Meeting()), lambda r: "true", 30)
    assert sorted(outs) == list(range(n)) and all(o.code == 0 for o in outs.values())


@pytest.mark.multihost
def test_port_in_use_on_master(make_hostset, tmp_path):
    with make_hostset(2, isolated_home=True) as hs:
        spec = base_spec(hs, tmp_path)
        port = spec["cluster"]["master_port"]
        code = (f"import socket,time; s=socket.socket(); s.bind(('0.0.0.0', {port})); s.listen(); "
                "print('up', flush=True); time.sleep(300)")
        squatter = hs.hosts[0].popen([sys.executable, "-c", code], stdout=-1)
        try:
            assert squatter.stdout.readline().strip() == "up"
            name = open(f"/proc/{squatter.pid}/comm").read().strip()   # python, python3, python3.11
            pid = hs.hosts[0].inner_pid(squatter.pid)   # its PID on that host, as the host shows it
            report = check(spec)
        finally:
            squatter.kill()
            squatter.wait()
        assert_only(report, {("network/port-free", 0)})
        r = only(report, "network/port-free", 0)
        ip = hs.hosts[0].ip
        assert f"TCP {port} is in use by {name} (pid {pid})" in r.detail
        assert r.fix == (f"stop {name} (pid {pid}) on {ip} (a leftover run? kill {pid}), "
                         "or set cluster.master_port to a free port")
        assert "answered by the process holding the port" in only(report, "network/port-reachable", 1).detail


@pytest.mark.multihost
def test_port_blocked_from_one_worker(make_hostset, tmp_path):
    """The seed's "ssh worked, 29500 did not": a firewall on the worker drops the master port."""
    with make_hostset(2, isolated_home=True) as hs:
        spec = base_spec(hs, tmp_path)
        spec["preflight"]["collective_timeout_s"] = 10
        port, master = spec["cluster"]["master_port"], hs.hosts[0].ip
        rules = ("table inet mlpf {\n chain out {\n  type filter hook output priority 0; policy accept;\n"
                 f"  ip daddr {master} tcp dport {port} drop\n }}\n}}\n")
        r = hs.hosts[1].run(["nft", "-f", "-"], input=rules)
        assert r.returncode == 0, r.stderr
        report = check(spec, fast_only=False)
        assert_only(report, {("network/port-reachable", 1), ("collective", None)})
        reach = only(report, "network/port-reachable", 1)
        assert reach.detail == f"cannot connect to {master}:{port} from {hs.hosts[1].ip}: timed out"
        assert reach.fix == f"open TCP {port} on {master} to the workers (security group / firewall)"
        col = only(report, "collective", None)
        assert col.detail.startswith(f"timed out after 10s in torchrun's rendezvous at {master}:{port}")
        assert "likely a blocked port or NIC" in col.detail
        assert col.fix.startswith(f"open TCP {port} on {master} to every worker")


def fake_llamafactory(tmp_path) -> str:
    """A site dir holding a `llamafactory` distribution (metadata and package): enough for
    the software check, which reads versions and never imports the trainer."""
    site = tmp_path / "site"
    (site / "llamafactory").mkdir(parents=True)
    (site / "llamafactory" / "__init__.py").write_text("")
    (site / "llamafactory-0.9.5.dist-info").mkdir()
    (site / "llamafactory-0.9.5.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: llamafactory\nVersion: 0.9.5\n")
    return str(site)


@pytest.mark.multihost
def test_dataset_missing_on_one_node(make_hostset, tmp_path):
    with make_hostset(2, isolated_home=True) as hs:
        data, model = tmp_path / "data", tmp_path / "model"
        data.mkdir()
        model.mkdir()
        (data / "dataset_info.json").write_text(json.dumps({"demo": {"file_name": "demo.json"}}))
        (data / "demo.json").write_text("[]")
        spec = base_spec(hs, tmp_path)
        spec["cluster"]["env"]["PYTHONPATH"] = fake_llamafactory(tmp_path)
        spec.pop("script")
        spec.update({"trainer": "llamafactory", "model": str(model), "template": "qwen",
                     "dataset": "demo", "dataset_dir": str(data), "cutoff_len": 64,
                     "finetuning": {"type": "lora"}, "batch": {"per_device": 1},
                     "training": {"learning_rate": 1e-4, "max_steps": 10}})
        # node1's copy of the dataset is missing: an empty directory over it, for node1 only.
        r = hs.hosts[1].in_mounts(["mount", "-t", "tmpfs", "tmpfs", str(data)])
        assert r.returncode == 0, r.stderr
        report = check(spec)
        assert_only(report, {("storage/inputs", 1)})
        bad = only(report, "storage/inputs", 1)
        assert bad.detail == f"dataset: {data}/dataset_info.json: No such file or directory"
        assert bad.fix.startswith(f"copy the dataset directory {data} (with dataset_info.json and its files) "
                                  f"to {hs.hosts[1].ip}, or keep it under cluster.shared_dir")
        assert "llamafactory 0.9.5" in only(report, "software/versions", 0).detail


@pytest.mark.multihost
def test_shared_dir_is_node_local_on_one_host(make_hostset, tmp_path):
    with make_hostset(2, isolated_home=True) as hs:
        spec = base_spec(hs, tmp_path)
        shared = spec["cluster"]["shared_dir"]
        r = hs.hosts[1].in_mounts(["mount", "-t", "tmpfs", "tmpfs", shared])
        assert r.returncode == 0, r.stderr
        report = check(spec)
        assert_only(report, {("storage/shared", 1)})
        bad = only(report, "storage/shared", 1)
        assert bad.detail == (f"{shared} here is not the storage node0 see "
                              "(sees files of: node1; its file seen by: node1)")
        assert bad.fix == (f"mount the shared filesystem at {shared} on {hs.hosts[1].ip} as on node0 "
                           f"(compare `findmnt -T {shared}` on both)")


@pytest.mark.multihost
def test_torch_version_differs_on_one_host(make_hostset, tmp_path):
    """host1's torch/version.py says 2.12.0: what `import torch; torch.__version__` gives there."""
    import torch
    real = os.path.join(os.path.dirname(torch.__file__), "version.py")
    fake = tmp_path / "version.py"
    with open(real) as fh:
        fake.write_text(fh.read().replace(torch.__version__, "2.12.0+cpu"))
    with make_hostset(2, isolated_home=True) as hs:
        r = hs.hosts[1].in_mounts(["mount", "--bind", str(fake), real])
        assert r.returncode == 0, r.stderr
        check_there = hs.hosts[1].in_mounts([sys.executable, "-c", "import torch; print(torch.__version__)"])
        assert check_there.stdout.strip() == "2.12.0+cpu"
        report = check(base_spec(hs, tmp_path))
        assert_only(report, {("software/versions", 1)})
        bad = only(report, "software/versions", 1)
        assert bad.detail == f"torch 2.12.0+cpu here, {torch.__version__} on node0"
        assert bad.fix == (f"{sys.executable} -m pip install 'torch==2.13.0' --index-url "
                           "https://download.pytorch.org/whl/cpu  (to match node0)")


@pytest.mark.multihost
def test_interface_that_does_not_exist_refuses_submit(make_hostset, tmp_path):
    """Through the real CLI: `mlaunch submit` runs the fast checks and starts nothing."""
    with make_hostset(2, isolated_home=True) as hs:
        spec = base_spec(hs, tmp_path)
        spec["cluster"]["env"]["GLOO_SOCKET_IFNAME"] = "ib0"
        report = check(spec)
        assert_only(report, {("network/ifname", 0), ("network/ifname", 1)})
        bad = only(report, "network/ifname", 1)
        assert bad.detail == "GLOO_SOCKET_IFNAME=ib0: no interface ib0 here"
        assert bad.fix == "set cluster.env.GLOO_SOCKET_IFNAME to one of: eth0"
        r = mlaunch("submit", write_spec(tmp_path, spec))
        assert r.returncode == 2, r.stdout + r.stderr
        assert "preflight failed" in r.stderr
        assert "fix: set cluster.env.GLOO_SOCKET_IFNAME to one of: eth0" in r.stdout
        assert "ready rank" not in r.stdout and "sum" not in r.stdout


@pytest.mark.multihost
def test_hostname_resolves_to_loopback(make_hostset, tmp_path, capsys):
    with make_hostset(2, isolated_home=True) as hs:
        h1 = hs.hosts[1]
        with open(h1.hosts_file) as fh:
            text = fh.read()
        with open(h1.hosts_file, "w") as fh:   # in place: the bind mount follows the inode
            fh.write(text.replace(f"{h1.ip}\t{h1.name}\n", f"127.0.1.1\t{h1.name}\n"))
        report = check(base_spec(hs, tmp_path))
        assert_only(report, {("network/hostname", 1)})
        bad = only(report, "network/hostname", 1)
        assert bad.detail.startswith(f"{h1.name} resolves to 127.0.1.1 (loopback)")
        assert bad.fix == (f"add `{h1.ip} {h1.name}` to /etc/hosts on every node "
                           f"(and remove the 127.0.1.1 {h1.name} line)")
        table = report.table()
        assert f"✗ network/hostname on node1 {h1.ip}: {bad.detail}\n    fix: {bad.fix}" in table


@pytest.mark.multihost
def test_hostname_on_another_address_is_dialed_there(make_hostset, tmp_path):
    """The mesh's first round dials each node at its SSH address; node 1's hostname resolves to
    a second address of its own, so the row is decided by a second round dialing that address:
    reachable on the shared link, it passes naming it; moved off the link (no other node has
    a route to it), it fails with what the dialers saw."""
    with make_hostset(2, isolated_home=True) as hs:
        h1 = hs.hosts[1]
        second = str(hs.subnet.network_address + 200)
        assert h1.run(["ip", "addr", "add", f"{second}/24", "dev", "eth0"]).returncode == 0
        text = open(h1.hosts_file).read()
        with open(h1.hosts_file, "w") as fh:   # in place: the bind mount follows the inode
            fh.write(text.replace(f"{h1.ip}\t{h1.name}\n", f"{second}\t{h1.name}\n"))
        good = check(base_spec(hs, tmp_path))
        assert only(good, "network/hostname", 1).detail == f"{h1.name} → {second}, reachable from every node"
        assert_only(good, set())
        far = "10.254.9.9"
        assert h1.run(["ip", "addr", "add", f"{far}/32", "dev", "lo"]).returncode == 0   # no route to it elsewhere
        with open(h1.hosts_file, "w") as fh:
            fh.write(text.replace(f"{h1.ip}\t{h1.name}\n", f"{far}\t{h1.name}\n"))
        bad = check(base_spec(hs, tmp_path))
    assert fails(bad) == {("network/hostname", 1)}, bad.table()
    assert only(bad, "network/hostname", 1).detail.startswith(f"{h1.name} → {far} is not reachable (node0: ")


@pytest.mark.multihost
def test_small_dev_shm(make_hostset, tmp_path):
    with make_hostset(2, isolated_home=True) as hs:
        r = hs.hosts[1].in_mounts(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", "/dev/shm"])
        assert r.returncode == 0, r.stderr
        report = check(base_spec(hs, tmp_path))
        assert_only(report, {("container/shm", 1)})
        bad = only(report, "container/shm", 1)
        assert bad.detail == "/dev/shm is 1 MB, need 16 MB"
        assert bad.fix.startswith("docker run --shm-size=2g")


@pytest.mark.multihost
def test_clock_skew_on_one_host(make_hostset, tmp_path):
    """host1's `date` runs 2.5 s ahead (a wrapper bind-mounted over it, host1 only)."""
    real = shutil.which("date")
    keep = tmp_path / "date.real"
    shutil.copy(real, keep)
    wrapper = tmp_path / "date"
    wrapper.write_text(f"#!/bin/sh\n{keep} +%s.%N | awk '{{printf \"%.9f\\n\", $1 + 2.5}}'\n")
    wrapper.chmod(0o755)
    with make_hostset(2, isolated_home=True) as hs:
        assert hs.hosts[1].in_mounts(["mount", "--bind", str(wrapper), real]).returncode == 0
        report = check(base_spec(hs, tmp_path))
        assert_only(report, {("clock", 1)})
        bad = only(report, "clock", 1)
        m = re.match(r"clock is \+(\d+\.\d) ms from the launcher \(±([\d.]+) ms\), limit 50 ms$", bad.detail)
        assert m and abs(float(m.group(1)) - 2500) <= float(m.group(2)) + 1, bad.detail
        assert bad.fix.startswith(f"sync the clock on {hs.hosts[1].ip}: enable NTP")


@pytest.mark.multihost
def test_sshd_down_gives_ssh_row_and_skips(make_hostset, tmp_path, capsys):
    with make_hostset(2, isolated_home=True) as hs:
        hs.hosts[1].stop_sshd()
        path = write_spec(tmp_path, base_spec(hs, tmp_path))
        rc = check_command(path, as_json=True)
        out = json.loads(capsys.readouterr().out)
        assert rc == 1 and out["ok"] is False
        rows = {(r["check"], r["node"]): r for r in out["results"]}
        ssh = rows[("ssh", 1)]
        assert ssh["status"] == "fail" and ssh["detail"] == "connection refused on port 22"
        assert ssh["fix"] == f"start sshd on {hs.hosts[1].ip}, or open TCP 22 to it (firewall / security group)"
        assert {r["status"] for (c, n), r in rows.items() if n == 1 and c != "ssh"} == {"skip"}
        assert rows[("collective", None)]["status"] == "skip"
        assert rows[("collective", None)]["detail"] == "not run: ssh failed on node1"
        assert all(r["status"] in ("pass", "skip") for (c, n), r in rows.items() if n == 0)


@pytest.mark.multihost
def test_collective_script_runs_as_a_plain_job(make_hostset, tmp_path):
    """tests/scripts/collective.py (the same template) through `mlaunch submit`, preflight included."""
    with make_hostset(2, isolated_home=True) as hs:
        spec = base_spec(hs, tmp_path)
        spec["script"] = {"path": os.path.join(os.path.dirname(__file__), "scripts", "collective.py"),
                          "args": ["--mb", "1", "--iters", "2"]}
        r = mlaunch("submit", write_spec(tmp_path, spec))
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr
        m = re.search(r"MLAUNCH-COLLECTIVE (\{.*\})", r.stdout)
        got = json.loads(m.group(1))
        assert got["world"] == 2 and got["backend"] == "gloo" and got["busbw_gbps"] > 0
        assert r.stdout.count("all-reduce correct") == 2


# --------------------------------------------------------------------------------------
# pure parts: no hosts
# --------------------------------------------------------------------------------------

def ctx_for(hosts: list[str], **cluster) -> Ctx:
    spec = {"name": "t", "trainer": "script",
            "cluster": {"hosts": hosts, "gpus_per_node": 2, "python": "/venv/bin/python", **cluster},
            "script": {"path": "x.py"}}
    return Ctx(build_plan(validate(spec)), executor=None)


IFACES = {"lo": {"up": True, "addrs": ["127.0.0.1"]}, "eth0": {"up": True, "addrs": ["10.0.0.1"]},
          "eth1": {"up": False, "addrs": []}, "docker0": {"up": True, "addrs": ["172.17.0.1"]},
          "ib0": {"up": True, "addrs": ["192.168.0.1"]}}


@pytest.mark.parametrize("spec,chosen", [
    ("eth", ["eth0", "eth1"]),              # a prefix, as NCCL matches it
    ("eth0,ib", ["eth0", "ib0"]),           # comma list
    ("=eth", []),                           # exact: no interface is called "eth"
    ("=eth0", ["eth0"]),
    ("^docker,lo", ["eth0", "eth1", "ib0"]),  # exclusion
    ("^=eth0", ["lo", "eth1", "docker0", "ib0"]),
    ("ib0:1", ["ib0"]),                     # a port suffix is not part of the name
])
def test_nccl_ifname_grammar(spec, chosen):
    assert ifname.nccl_selected(spec, list(IFACES)) == chosen


@pytest.mark.parametrize("var,spec,problem", [
    ("NCCL_SOCKET_IFNAME", "eth", None),
    ("NCCL_SOCKET_IFNAME", "bond", "NCCL_SOCKET_IFNAME=bond matches no usable interface here"),
    ("NCCL_SOCKET_IFNAME", "eth1", "NCCL_SOCKET_IFNAME=eth1 matches no usable interface here"),
    ("NCCL_SOCKET_IFNAME", "^eth,docker,ib",
     "NCCL_SOCKET_IFNAME=^eth,docker,ib leaves only lo: traffic to other nodes would go to loopback"),
    ("NCCL_SOCKET_IFNAME", "lo", "NCCL_SOCKET_IFNAME=lo leaves only lo: traffic to other nodes would go to loopback"),
    ("GLOO_SOCKET_IFNAME", "eth0,ib0", None),
    ("GLOO_SOCKET_IFNAME", "eth", "GLOO_SOCKET_IFNAME=eth: no interface eth here"),   # gloo: exact names
    ("GLOO_SOCKET_IFNAME", "eth1", "GLOO_SOCKET_IFNAME=eth1: eth1 is down or has no address"),
])
def test_ifname_problems(var, spec, problem):
    assert ifname.problem(var, spec, IFACES) == problem


SMI_GPUS = ("0, GPU-aaa, 550.54.15, 0, 81559\n1, GPU-bbb, 550.54.15, 3, 81559\n"
            "2, GPU-ccc, 550.54.15, 40960, 81559\n3, GPU-ddd, 550.54.15, [N/A], 81559\n")
SMI_APPS = "GPU-bbb, 4242, python, 10240\n"


def gpu_facts(gpus=SMI_GPUS, apps="", code=0):
    return {"gpu": {"smi": "/usr/bin/nvidia-smi", "code": code, "gpus": gpus, "apps": apps}}


def test_gpu_parsing_and_verdicts():
    assert [g["index"] for g in gpu.parse_gpus(SMI_GPUS)] == [0, 1, 2, 3]
    assert gpu.parse_gpus(SMI_GPUS)[3]["used"] == 0.0
    assert gpu.parse_apps("GPU-b, 7, my, odd, name, 12\n") == [
        {"uuid": "GPU-b", "pid": 7, "name": "my, odd, name", "used": 12.0}]
    ctx = ctx_for(["a", "b", "c", "d"])
    other_driver = SMI_GPUS.replace("550.54.15", "535.104.05")
    rows = {r.node: r for r in gpu.check(ctx, {0: gpu_facts(), 1: gpu_facts(apps=SMI_APPS),
                                               2: gpu_facts(other_driver), 3: {"gpu": {"smi": None}}})}
    assert rows[0].status == "pass" and rows[0].detail == "4 GPU(s), driver 550.54.15, idle"
    assert rows[1].detail == "in use: GPU 1: 10240 MiB by pid 4242 (python)"
    assert rows[1].fix == "stop pid 4242 on b (kill 4242), or pick idle GPUs with cluster.cuda_visible_devices"
    assert rows[2].detail == "driver 535.104.05 here, 550.54.15 on node0"
    assert rows[3].status == "skip" and "no nvidia-smi" in rows[3].detail
    # GPU 2 holds 40 GB that no listed process owns (another container): busy when used.
    busy = gpu.check(ctx_for(["a"], cuda_visible_devices=[2, 3]), {0: gpu_facts()})[0]
    assert busy.detail.startswith("GPU 2: 40960 MiB in use by a process not visible here")
    few = gpu.check(ctx_for(["a"], gpus_per_node=8), {0: gpu_facts()})[0]
    assert few.detail == "sees 4 GPU(s), the job uses 8 (missing index 4, 5, 6, 7)"
    # Two nodes on one 4-GPU host, each with its own devices; node 1 names GPUs that don't exist.
    pair = ctx_for(["a", "a"], gpus_per_node=2, cuda_visible_devices=[[0, 1], [4, 5]])
    rows = gpu.check(pair, {0: gpu_facts(), 1: gpu_facts()})
    assert rows[0].status == "pass" and rows[1].detail == "sees 4 GPU(s), the job uses 2 (missing index 4, 5)"
    assert rows[1].fix == "list GPUs that exist on a (0-3) in cluster.cuda_visible_devices"
    broken = gpu.check(ctx, {0: gpu_facts("NVIDIA-SMI has failed because it couldn't communicate with "
                                          "the NVIDIA driver.\n", code=9)})[0]
    assert broken.status == "fail" and broken.detail.startswith("nvidia-smi failed: NVIDIA-SMI has failed")


def test_transformers_differs_on_one_node():
    """The rendered trainer arguments follow the nodes' transformers: they must agree."""
    ctx = ctx_for(["a", "b", "c"])
    base = {"python": {"version": "3.11.7", "exe": "/venv/bin/python"},
            "torch": {"version": "2.13.0+cpu", "cuda": None, "nccl": "none"},
            "torchrun": {"wanted": "/venv/bin/torchrun", "ok": True}}
    four = {**base, "trainer": {"name": "llamafactory", "version": "0.9.5", "transformers": "4.57.6"}}
    five = {**base, "trainer": {"name": "llamafactory", "version": "0.9.5", "transformers": "5.17.0"}}
    facts = {0: four, 1: four, 2: five}
    rows = {r.node: r for r in software.check_versions(ctx, facts)}
    assert rows[0].status == rows[1].status == "pass"
    assert rows[2].detail == "transformers 5.17.0 here, 4.57.6 on node0"
    assert rows[2].fix == "/venv/bin/python -m pip install 'transformers==4.57.6'  (to match node0)"
    assert software.majority_stack(ctx, facts)["transformers"] == "4.57.6"


def test_versions_majority_and_pip_fix():
    ctx = ctx_for(["a", "b", "c"])
    stack = {"python": {"version": "3.11.7", "exe": "/venv/bin/python"},
             "torch": {"version": "2.13.0+cu126", "cuda": "12.6", "nccl": "2.27.3"},
             "trainer": {"name": None}, "torchrun": {"wanted": "/venv/bin/torchrun", "ok": True}}
    odd = {**stack, "torch": {"version": "2.12.1+cu121", "cuda": "12.1", "nccl": "2.21.5"}}
    rows = {r.node: r for r in software.check_versions(ctx, {0: odd, 1: stack, 2: stack})}
    assert rows[1].status == rows[2].status == "pass"
    assert rows[0].detail == ("torch 2.12.1+cu121 here, 2.13.0+cu126 on node1; cuda 12.1 here, 12.6 on node1; "
                              "nccl 2.21.5 here, 2.27.3 on node1")
    assert rows[0].fix == ("/venv/bin/python -m pip install 'torch==2.13.0' --index-url "
                           "https://download.pytorch.org/whl/cu126  (to match node1)")
    no_torchrun = {**stack, "torchrun": {"wanted": "/venv/bin/torchrun", "ok": False,
                                         "on_path": "/usr/bin/torchrun"}}
    row = software.check_python(ctx, {0: stack, 1: no_torchrun, 2: stack})[1]
    assert row.detail == ("no torchrun next to /venv/bin/python (there is one at /usr/bin/torchrun, "
                          "but mlaunch runs /venv/bin/torchrun)")
    missing = software.check_python(ctx, {0: {"python": {"missing": True}}, 1: {"nopython": True},
                                          2: "facts probe failed (exit 255: connection lost)"})
    assert [r.detail for r in missing] == ["no interpreter at /venv/bin/python",
                                           "no /venv/bin/python and no python3 on PATH",
                                           "facts probe failed (exit 255: connection lost)"]


def test_shared_groups():
    # 3 nodes share the storage; node 3 has its own: the majority is the shared storage.
    assert storage.main_group({0: {0, 1, 2}, 1: {0, 1, 2}, 2: {0, 1, 2}, 3: {3}}) == {0, 1, 2}
    assert storage.main_group({0: {0}, 1: {1}}) == {0}          # a tie: node 0's side
    assert storage.main_group({0: {0}, 1: {1, 2}, 2: {1, 2}}) == {1, 2}


def test_ssh_fix_lines():
    assert ssh_fix("h", "host key unknown and strict_host_keys is on; verify the fingerprint, then run: "
                        "ssh-keyscan -p 22 h >> kh", 22) == (
        "host key unknown and strict_host_keys is on",
        "verify the fingerprint, then run: ssh-keyscan -p 22 h >> kh")
    assert ssh_fix("h", "no answer within 10s: host down, or port 22 firewalled?", 22) == (
        "no answer within 10s: host down, or port 22 firewalled?",
        "check that h is up and TCP 22 is open from this machine")


def test_table_groups_identical_failures_and_json():
    rows = (CheckResult("ssh", 0, "a", "pass", "ok"), CheckResult("ssh", 1, "b", "pass", "ok"),
            CheckResult("network/port-free", 0, "a", "pass", "free"),
            CheckResult("network/ifname", 0, "a", "fail", "X=ib0: no interface ib0 here", "set X to eth0"),
            CheckResult("network/ifname", 1, "b", "fail", "X=ib0: no interface ib0 here", "set X to eth0"),
            CheckResult("collective", None, None, "skip", "not run: network/ifname failed"))
    rep = Report(rows, 1.25)
    assert not rep.ok
    lines = rep.table().splitlines()
    assert lines[:3] == ["check              node0  node1",
                         "                   a      b",
                         "ssh                ✓      ✓"]
    assert lines[3] == "network/port-free  ✓"          # blank cell: the check is node 0's only
    assert lines[4] == "network/ifname     ✗      ✗"
    assert lines[5] == "collective         – not run: network/ifname failed"
    assert "✗ network/ifname on node0 a, node1 b: X=ib0: no interface ib0 here" in lines
    assert "    fix: set X to eth0" in lines
    assert lines[-1] == "preflight on 2 nodes in 1.2s: 1 check failed (network/ifname)"
    assert "\033[31m✗\033[0m" in rep.table(color=True)
    data = json.loads(rep.to_json())
    assert data["ok"] is False and data["results"][3] == {
        "check": "network/ifname", "node": 0, "host": "a", "status": "fail",
        "detail": "X=ib0: no interface ib0 here", "fix": "set X to eth0"}


def test_collective_verdicts_from_output():
    ctx = ctx_for(["10.0.0.1", "10.0.0.2"], master_port=29500)
    plan = ctx.plan
    nodes = [NodeOutcome(0, "10.0.0.1", Exit(143), terminated=True), NodeOutcome(1, "10.0.0.2", Exit(143))]
    stuck = collective.judge(ctx, plan, JobResult(124, nodes, timed_out=True), "[mlaunch] time limit reached\n")
    assert stuck.detail.startswith("timed out after 180s in torchrun's rendezvous at 10.0.0.1:29500 "
                                   "(no rank started on node0, node1)")
    started = "".join(f"[node{n} h local0] mlaunch-collective: rank {n}/2 starting (gloo)\n" for n in (0, 1))
    half = collective.judge(ctx, plan, JobResult(124, nodes, timed_out=True), started)
    assert half.detail.startswith("timed out after 180s in init_process_group")
    wrong = [NodeOutcome(0, "10.0.0.1", Exit(0)),
             NodeOutcome(1, "10.0.0.2", Exit(3),
                         tail=["[local0] mlaunch-collective: rank 1/2 WRONG all-reduce result on this rank"])]
    bad = collective.judge(ctx, plan, JobResult(3, wrong, first_failure=1), "")
    assert bad.detail == "node1 10.0.0.2: exit 3: mlaunch-collective: rank 1/2 WRONG all-reduce result on this rank"
    assert "wrong sum" in bad.fix
    good = collective.judge(ctx, plan, JobResult(0, wrong[:1]), 'MLAUNCH-COLLECTIVE {"ok": true, "world": 4, '
                            '"backend": "nccl", "mb": 64.0, "seconds": 0.01, "algbw_gbps": 6.4, "busbw_gbps": 9.6}')
    assert good.status == "pass" and good.detail == "4 ranks (nccl): correct; 64 MB busbw 9.60 GB/s (algbw 6.40)"


def test_input_specs_per_trainer():
    from types import SimpleNamespace
    from launcher.preflight.probe import input_specs
    lf = validate({"name": "lf", "trainer": "llamafactory", "cluster": {"hosts": ["a"], "gpus_per_node": 1},
                   "model": "Qwen/Qwen2-7B", "template": "qwen", "dataset": ["alpaca,identity", "x"],
                   "finetuning": {"type": "lora"}, "batch": {"per_device": 1},
                   "training": {"learning_rate": 1e-4, "max_steps": 1}, "output_dir": "/o"})
    assert input_specs(lf) == [{"what": "model", "kind": "model", "path": "Qwen/Qwen2-7B"},
                               {"what": "dataset", "kind": "dataset", "path": "data",
                                "names": ["alpaca", "identity", "x"], "stage": "sft"}]
    # ms-swift style datasets: only local paths are checked (hub ids are fetched at start).
    swift = SimpleNamespace(trainer="swift", model="/m", dataset=["AI-ModelScope/alpaca#500", "/d/x.jsonl#100"])
    assert input_specs(swift) == [{"what": "model", "kind": "model", "path": "/m"},
                                  {"what": "dataset", "kind": "path", "path": "/d/x.jsonl"}]


def test_stale_jit_build_lock_is_named(tmp_path):
    """A torch/DeepSpeed JIT build killed half-way leaves `lock`; every rank would wait on it."""
    ext = tmp_path / "ext"
    stale = ext / "deepspeed_shm_comm" / "lock"
    fresh = ext / "py311_cpu" / "fused_adam" / "lock"
    for lock in (stale, fresh):
        lock.parent.mkdir(parents=True)
        lock.write_text("")
    hour_ago = time.time() - 3600
    os.utime(stale, (hour_ago, hour_ago))
    spec = script_job(["localhost"], 1, "allreduce.py", [], str(tmp_path / "out"),
                      env={"TORCH_EXTENSIONS_DIR": str(ext)})
    spec["preflight"] = dict(PF)
    report = check(spec)
    row = report.get("software/jit-lock", 0)
    assert row.status == "fail" and row.detail.startswith(f"{stale} is 60 min old"), row
    assert row.fix == f"rm {stale}  (on localhost, if no build runs there: pgrep -f ninja)"
    os.remove(stale)
    row = check(spec).get("software/jit-lock", 0)
    assert row.status == "pass" and row.detail == f"no stale lock in {ext}; a build is running (1 fresh lock)"


FAKE_LIBNCCL = "int ncclGetVersion(int *v) { *v = 22703; return 0; }\n"


def fake_cuda_torch(root, nccl_wheel: str | None = None, libnccl: bool = False) -> None:
    """A CUDA-looking torch under root whose import leaves a marker (and fails)."""
    torch = root / "torch"
    (torch / "lib").mkdir(parents=True)
    (torch / "version.py").write_text("__version__ = '2.11.0+cu130'\ncuda = '13.0'\n")
    (torch / "__init__.py").write_text(f"open({str(root / 'imported')!r}, 'w').close()\n"
                                       "raise ImportError('fake torch')\n")
    if nccl_wheel:
        info = root / f"nvidia_nccl_cu13-{nccl_wheel}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nvidia-nccl-cu13\nVersion: {nccl_wheel}\n")
    if libnccl:
        src = root / "nccl.c"
        src.write_text(FAKE_LIBNCCL)
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(torch / "lib" / "libnccl.so.2"), str(src)],
                       check=True)


@pytest.mark.parametrize("how", ["wheel", "library", "static"])
def test_fast_checks_read_nccl_without_importing_torch(tmp_path, how):
    """CUDA nodes: the NCCL version comes from the wheel's metadata or the library's
    ncclGetVersion, never from `import torch` (seconds per node) in submit's fast checks."""
    fake = tmp_path / "site"
    fake_cuda_torch(fake, nccl_wheel="2.28.9" if how == "wheel" else None, libnccl=how == "library")
    spec = script_job(["localhost"], 1, "allreduce.py", [], str(tmp_path / "out"),
                      env={"PYTHONPATH": str(fake)})
    spec["preflight"] = dict(PF)
    row = check(spec).get("software/versions", 0)
    want = {"wheel": "nccl 2.28.9", "library": "nccl 2.27.3",
            "static": "nccl not read (linked into torch; `mlaunch check` reads it)"}[how]
    assert row.status == "pass" and "torch 2.11.0+cu130, cuda 13.0, " + want in row.detail, row
    assert not (fake / "imported").exists(), "the fast checks imported torch"


def test_pyspy_row_says_what_a_hang_loses_and_the_fix():
    from types import SimpleNamespace
    from launcher.preflight.software import check_pyspy
    from launcher.spec import validate
    from .helpers import seed000
    job = validate(seed000())
    ctx = SimpleNamespace(plan=SimpleNamespace(job=job), live=[0, 1, 2],
                          nodes=[SimpleNamespace(host=f"h{i}") for i in range(3)])
    facts = {0: {"pyspy": {"path": None, "ptrace_scope": 1, "root": True}},
             1: {"pyspy": {"path": "/v/bin/py-spy", "ptrace_scope": 1, "root": False}},
             2: {"pyspy": {"path": "/v/bin/py-spy", "ptrace_scope": 1, "root": True}}}
    rows = check_pyspy(ctx, facts)
    assert [(r.status, r.detail) for r in rows] == [
        ("skip", "py-spy not found: a hang is torn down without stack dumps; "
                 "pip install py-spy into /opt/conda/bin"),
        ("skip", "/v/bin/py-spy, but kernel.yama.ptrace_scope=1 refuses ptrace of the ranks: "
                 "sysctl kernel.yama.ptrace_scope=0, or give py-spy CAP_SYS_PTRACE"),
        ("pass", "/v/bin/py-spy")]


def test_the_second_mesh_round_runs_only_for_what_the_first_did_not_prove(monkeypatch):
    """settle_mesh: a first round that reached every node at its advertised address runs no
    second; a node reached at another address (or whose listener failed) is dialed again at
    its advertised address on its facts' port, and only it."""
    from launcher.preflight import network
    spec = script_job(["10.9.0.1", "10.9.0.2"], 1, "x.py", [], "/tmp/out")
    ctx = Ctx(build_plan(validate(spec)), None)
    facts = {r: {"host": {"hostname": f"n{r}", "addrs": [f"10.9.0.{r + 1}"]}, "mesh_port": {"port": 40000 + r}}
             for r in (0, 1)}

    def mesh(ip1: str) -> dict:
        dial = lambda r, ip: {"ok": True, "peer": r, "ip": ip, "ms": 1.0}  # noqa: E731
        return {0: {"listen": {"mesh": {"ok": True, "got": [1]}}, "dials": {"node1": dial(1, ip1)}, "shared": {}},
                1: {"listen": {"mesh": {"ok": True, "got": [0]}}, "dials": {"node0": dial(0, "10.9.0.1")}, "shared": {}}}

    runs = []
    monkeypatch.setattr(network, "_run", lambda ctx, plan: runs.append(plan) or {})
    clean = mesh("10.9.0.2")
    assert network.settle_mesh(ctx, facts, clean) == clean and runs == []
    network.settle_mesh(ctx, facts, mesh("192.168.7.2"))   # SSH reached node 1 by another address
    (plan,) = runs
    assert [d for d in plan[0]["dials"]] == [{"key": "node1", "addr": "10.9.0.2", "port": 40001, "expect": 1}]
    assert plan[1]["listen"] == [{"key": "mesh", "port": 40001, "expect": 1}] and plan[1]["dials"] == []

"""The NCCL transport in `mlaunch check`: the parser on recorded NCCL INFO output (IB, RoCE,
TCP fallback, a net plugin; tests/data/nccl/, written from NCCL's format strings), and the
collective rows that preflight.expect_transport turns into ✗ with the fix."""
from __future__ import annotations

import os

import pytest

from launcher.transport.base import Exit
from launcher.session.attempt import JobResult, NodeOutcome
from launcher.preflight import Report, collective, transport

from launcher.plan.launch_plan import build_plan
from launcher.preflight.probe import Ctx
from launcher.spec import validate

DATA = os.path.join(os.path.dirname(__file__), "data", "nccl")
RESULT = ('[node0 10.0.0.1 local0] MLAUNCH-COLLECTIVE {"ok": true, "world": 4, "backend": "nccl", '
          '"mb": 64.0, "seconds": 0.01, "algbw_gbps": 6.4, "busbw_gbps": 9.6}\n')


def log(name: str) -> str:
    with open(os.path.join(DATA, f"{name}.log"), encoding="utf-8") as fh:
        return fh.read()


@pytest.mark.parametrize("name,network,kind,devices,inter,intra", [
    ("ib", "IB", "ib", ("mlx5_0:1/IB", "mlx5_1:1/IB"), ("NET/IB/GDRDMA",), ("P2P",)),
    ("roce", "IB", "roce", ("mlx5_0:1/RoCE", "mlx5_1:1/RoCE"), ("NET/IB/GDRDMA",), ("P2P",)),
    ("socket", "Socket", "socket", ("eth0:10.0.0.1<0>",), ("NET/Socket",), ("P2P",)),
    ("plugin", "AWS Libfabric", "plugin", (), ("NET/AWS Libfabric/GDRDMA",), ("P2P",)),
])
def test_parser_on_recorded_logs(name, network, kind, devices, inter, intra):
    nodes = transport.by_node(log(name))
    assert sorted(nodes) == [0, 1]
    t = nodes[0]
    assert (t.network, t.kind, t.devices, t.inter, t.intra) == (network, kind, devices, inter, intra)
    assert nodes[1].kind == kind
    assert t.ib_missing == (name == "socket")


def test_labels_name_devices_and_channels():
    ib, sock = transport.by_node(log("ib"))[0], transport.by_node(log("socket"))[1]
    assert ib.label() == "IB mlx5_0:1/IB,mlx5_1:1/IB; inter-node NET/IB/GDRDMA; intra-node P2P"
    assert sock.label() == "Socket eth0:10.0.0.2; inter-node NET/Socket; intra-node SHM"


def rows(text: str, expect: str = "any", result: JobResult | None = None):
    spec = {"name": "t", "trainer": "script", "script": {"path": "x.py"},
            "cluster": {"hosts": ["10.0.0.1", "10.0.0.2"], "gpus_per_node": 2, "python": "/venv/bin/python"},
            "preflight": {"expect_transport": expect}}
    ctx = Ctx(build_plan(validate(spec)), executor=None)
    result = result or JobResult(0, [NodeOutcome(0, "10.0.0.1", Exit(0)), NodeOutcome(1, "10.0.0.2", Exit(0))])
    return collective.rows(ctx, ctx.plan, result, text)


def test_bandwidth_row_names_the_transport_and_any_passes():
    coll, trans = rows(log("ib") + RESULT)
    assert coll.status == "pass"
    assert coll.detail == "4 ranks (nccl): correct; 64 MB busbw 9.60 GB/s (algbw 6.40) over NET/IB/GDRDMA"
    assert trans.status == "pass" and trans.check == "collective/transport"
    assert trans.detail == "node0,1: IB mlx5_0:1/IB,mlx5_1:1/IB; inter-node NET/IB/GDRDMA; intra-node P2P"


@pytest.mark.parametrize("name,expect", [("ib", "ib"), ("roce", "roce"), ("socket", "socket"),
                                         ("plugin", "any")])
def test_expected_transport_matches(name, expect):
    assert rows(log(name) + RESULT, expect)[1].status == "pass"


def test_socket_fallback_when_ib_expected_is_a_failure_with_the_fix():
    coll, trans = rows(log("socket") + RESULT, "ib")
    assert coll.status == "pass"   # the sum was right; the network is the problem
    assert trans.status == "fail"
    assert trans.detail.startswith("expected ib; node0: NCCL chose Socket eth0:10.0.0.1; inter-node "
                                   "NET/Socket; intra-node P2P (no IB device found, TCP fallback) | node1: ")
    assert "ibstat" in trans.fix and "NCCL_IB_HCA" in trans.fix
    table = Report((coll, trans), 1.0).table()
    assert "✗ collective/transport on cluster: expected ib; node0: NCCL chose Socket" in table
    assert "    fix: run `ibstat` on the node" in table


def test_one_node_falls_back_and_is_named():
    ib = log("ib").splitlines(keepends=True)
    sock = log("socket").splitlines(keepends=True)
    mixed = "".join([ln for ln in ib if ln.startswith("[node0")] + [ln for ln in sock if ln.startswith("[node1")])
    trans = rows(mixed + RESULT, "ib")[1]
    assert trans.status == "fail"
    first, second = trans.detail.removeprefix("expected ib; ").split(" | ")
    assert first.startswith("node1: NCCL chose Socket eth0:10.0.0.2")
    assert second.startswith("node0: IB mlx5_0:1/IB")


@pytest.mark.parametrize("name,expect,fix_has", [
    ("roce", "ib", "link layer InfiniBand"), ("ib", "roce", "link layer Ethernet (RoCE)"),
    ("ib", "socket", "NCCL_IB_DISABLE=1"), ("plugin", "ib", "NCCL_NET_PLUGIN"),
])
def test_other_mismatches(name, expect, fix_has):
    trans = rows(log(name) + RESULT, expect)[1]
    assert trans.status == "fail" and fix_has in trans.fix, trans


def test_gloo_reports_tcp():
    text = "".join(f"[node{n} h local0] mlaunch-collective: rank {n}/2 starting (gloo)\n" for n in (0, 1))
    text += RESULT.replace('"nccl"', '"gloo"')
    coll, trans = rows(text, "socket")
    assert coll.detail.endswith("over gloo/tcp") and (trans.status, trans.detail) == ("pass", "node0,1: gloo/tcp")
    bad = rows(text, "ib")[1]
    assert bad.status == "fail" and "gloo over TCP" in bad.detail


def test_no_transport_row_when_nothing_started():
    nodes = [NodeOutcome(0, "10.0.0.1", Exit(143), terminated=True), NodeOutcome(1, "10.0.0.2", Exit(143))]
    got = rows("[mlaunch] time limit reached\n", "ib", JobResult(124, nodes, timed_out=True))
    assert [r.check for r in got] == ["collective"]


def test_nccl_info_is_on_for_the_check_only():
    spec = {"name": "t", "trainer": "script", "script": {"path": "x.py"},
            "cluster": {"hosts": ["10.0.0.1", "10.0.0.2"], "gpus_per_node": 2, "python": "/venv/bin/python",
                        "env": {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p", "NCCL_IB_HCA": "mlx5_0"}}}
    user = build_plan(validate(spec))
    check = collective.collective_plan(Ctx(user, executor=None), "pf-1", "/tmp/x")
    env = dict(check.nodes[1].env)
    assert (env["NCCL_DEBUG"], env["NCCL_DEBUG_SUBSYS"], env["NCCL_IB_HCA"]) == ("INFO", "INIT,NET", "mlx5_0")
    assert "NCCL_DEBUG_FILE" not in env
    assert dict(user.nodes[1].env)["NCCL_DEBUG"] == "WARN"


def test_mixed_nodes_name_both_channels_in_the_bandwidth_row():
    ib = [ln for ln in log("ib").splitlines(keepends=True) if ln.startswith("[node0")]
    sock = [ln for ln in log("socket").splitlines(keepends=True) if ln.startswith("[node1")]
    coll = rows("".join(ib + sock) + RESULT)[0]
    assert coll.detail.endswith("over NET/IB/GDRDMA and NET/Socket")

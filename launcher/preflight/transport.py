"""Which network NCCL really used, read from its NCCL_DEBUG=INFO lines (pure: text in, verdict out).

The lines, as NCCL prints them (INIT and NET subsystems):
  `Using network IB` | `Using network Socket` | `Using network <plugin name>`     (init.cc)
  `NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:10.0.0.1<0>`      (net_ib)
  `NET/IB : No device found.` then `NET/Socket : Using [0]eth0:10.0.0.1<0>`       (the TCP fallback)
  `NET/Plugin: Loaded net plugin <name> (v8)`
  `Channel 00/0 : 0[0] -> 4[0] [send] via NET/IB/0/GDRDMA`, `via NET/Socket/0`   (transport/net.cc)
  `Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read`, `via SHM/direct/direct`        (inside a node)
"""
from __future__ import annotations

import re
from dataclasses import dataclass

NODE = re.compile(r"^\[node(\d+) [^\]]*\] ?(.*)$")
NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
PLUGIN = re.compile(r"NCCL INFO NET/Plugin: Loaded net plugin (.+?) \(v\d+\)")
IB_DEVS = re.compile(r"NCCL INFO NET/IB : Using((?: \[\d+\][^ \[;]+)+)")
IB_NONE = re.compile(r"NCCL INFO NET/IB : No device found")
SOCK_DEVS = re.compile(r"NCCL INFO NET/Socket : Using((?: \[\d+\][^ \[;]+)+)")
DEV = re.compile(r"\[\d+\]([^ \[;]+)")
VIA = re.compile(r"NCCL INFO Channel \S+ : .* via (NET/([^/]+)(?:/\d+(?:\(\d+\))?)?(/GDRDMA)?|P2P|SHM|CollNet)")

EXPECT = ("ib", "roce", "socket", "any")


@dataclass(frozen=True)
class Transport:
    """What one node's NCCL chose: network, devices with link layer, and how channels go."""

    network: str | None = None            # "IB", "Socket", a plugin's name; None: never said
    devices: tuple[str, ...] = ()          # "mlx5_0:1/IB", "mlx5_0:1/RoCE", "eth0:10.0.0.1<0>"
    ib_missing: bool = False               # "NET/IB : No device found."
    inter: tuple[str, ...] = ()            # inter-node channel kinds: "NET/IB/GDRDMA", "NET/Socket"
    intra: tuple[str, ...] = ()            # inside the node: "P2P", "SHM"

    @property
    def kind(self) -> str | None:
        """ib | roce | socket | plugin, or None when NCCL said nothing (gloo, no INFO lines)."""
        if self.network is None:
            return None
        if self.network.startswith("IB"):  # IB, and the IBext RDMA/SHARP plugin
            links = {d.rsplit("/", 1)[-1] for d in self.devices if "/" in d}
            return "roce" if links == {"RoCE"} else "ib"
        return "socket" if self.network == "Socket" else "plugin"

    def label(self) -> str:
        """One human phrase: `IB mlx5_0:1/IB; inter-node NET/IB/GDRDMA; intra-node P2P`."""
        parts = [self.network or "no NCCL transport lines"]
        if self.devices:
            parts[0] += " " + ",".join(d.split("<")[0] for d in self.devices)
        if self.inter:
            parts.append("inter-node " + ",".join(self.inter))
        if self.intra:
            parts.append("intra-node " + ",".join(self.intra))
        return "; ".join(parts)


def parse(lines: list[str]) -> Transport:
    """One node's transport from its output lines (any prefix before `NCCL INFO` is ignored)."""
    network = plugin = None
    ib_devs: list[str] = []
    sock_devs: list[str] = []
    ib_missing = False
    inter: list[str] = []
    intra: list[str] = []
    for line in lines:
        if "NCCL INFO" not in line:
            continue
        if m := NETWORK.search(line):
            network = m.group(1)
        elif m := PLUGIN.search(line):
            plugin = m.group(1)
        elif m := IB_DEVS.search(line):
            ib_devs = DEV.findall(m.group(1))
        elif m := SOCK_DEVS.search(line):
            sock_devs = DEV.findall(m.group(1))
        elif IB_NONE.search(line):
            ib_missing = True
        elif m := VIA.search(line):
            kind = f"NET/{m.group(2)}{m.group(3) or ''}" if m.group(2) else m.group(1)
            bucket = inter if kind.startswith(("NET/", "CollNet")) else intra
            if kind not in bucket:
                bucket.append(kind)
    network = network or plugin
    devices = sock_devs if network == "Socket" else ib_devs if network and network.startswith("IB") \
        else ib_devs or sock_devs
    return Transport(network, tuple(devices), ib_missing, tuple(inter), tuple(intra))


def by_node(text: str) -> dict[int, Transport]:
    """Every node's transport from launcher output whose lines carry `[node<k> host ...]` tags."""
    lines: dict[int, list[str]] = {}
    for line in text.splitlines():
        if m := NODE.match(line):
            lines.setdefault(int(m.group(1)), []).append(m.group(2))
    return {k: parse(v) for k, v in sorted(lines.items())}


def mismatch(t: Transport, expect: str) -> tuple[str, str] | None:
    """(what is wrong, the fix) when node transport t is not the expected one; None if it is."""
    if expect == "any":
        return None
    got = t.kind
    if got is None:
        return ("NCCL printed no `Using network` line",
                "unset NCCL_DEBUG_FILE for the check, or run the check on GPU nodes (CPU nodes use gloo)")
    socket_chans = any(c.startswith("NET/Socket") for c in t.inter)
    if got == expect and not (expect in ("ib", "roce") and socket_chans):
        return None
    said = f"NCCL chose {t.label()}"
    if expect in ("ib", "roce") and (got == "socket" or socket_chans):
        why = "no IB device found, TCP fallback" if t.ib_missing else "TCP sockets, not RDMA"
        return (f"{said} ({why})",
                "run `ibstat` on the node (ports Active, which link layer); set NCCL_IB_HCA to its "
                "HCAs (e.g. mlx5_0,mlx5_1) and make sure NCCL_IB_DISABLE is not 1")
    if expect in ("ib", "roce") and got in ("ib", "roce"):
        want = "InfiniBand" if expect == "ib" else "Ethernet (RoCE)"
        return (f"{said}: link layer is {'RoCE' if got == 'roce' else 'IB'}",
                f"`ibstat` shows each port's link layer; set NCCL_IB_HCA to the ports with link "
                f"layer {want}, or set preflight.expect_transport: {got}")
    if expect == "socket":
        return (f"{said}, not TCP sockets",
                "to run over TCP set NCCL_IB_DISABLE=1 and NCCL_SOCKET_IFNAME to the interface, "
                f"or set preflight.expect_transport: {got if got != 'plugin' else 'any'}")
    return (f"{said} (a net plugin), not {expect}",
            "unset NCCL_NET_PLUGIN / NCCL_NET or remove the plugin to use NCCL's own IB; "
            "or set preflight.expect_transport: any")


def gloo_mismatch(expect: str) -> tuple[str, str] | None:
    """gloo runs over TCP: fine for socket/any, a mismatch for ib/roce."""
    if expect in ("any", "socket"):
        return None
    return ("the all-reduce ran gloo over TCP (no CUDA on the nodes): no NCCL, no "
            f"{'InfiniBand' if expect == 'ib' else 'RoCE'}",
            "run the check where torch sees the GPUs (CUDA_VISIBLE_DEVICES, the CUDA torch build), "
            "or set preflight.expect_transport: any")

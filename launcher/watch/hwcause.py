"""Hardware-looking causes in a node's output (issue 29): which node a restart should not reuse.

Pure: it reads lines. A node whose ranks printed one of these is replaced by a spare (or
dropped by a shrink, or excluded by a scheduler) before the next attempt, as a lost node is.
Two kinds:

* DEVICE: the node's own GPU, driver or NVLink said it failed (an ECC error, a GPU fallen off
  the bus, no usable CUDA device, NCCL's "unhandled cuda error"). Only that node prints them.
* LINK: NCCL's "unhandled system error" and InfiniBand completion errors. A peer of the node
  that failed may print them too when its connection breaks, so they count only for the
  node that failed first (the one mlaunch did not tear down), and only when no node was
  lost (the peers of a lost node print them, often before the loss is seen).

Software errors that merely mention CUDA (out of memory, an illegal memory access, a device-side
assert) are not here: a restart on the same node is the right answer to them.
"""
from __future__ import annotations

import re

DEVICE = (
    # Not any "ECC error": nvidia-smi -q lists "ECC Errors" counters on a healthy GPU.
    (re.compile(r"uncorrectable ECC error|cudaErrorECCUncorrectable", re.I), "GPU ECC error"),
    # Only the Xids of failed hardware (double-bit ECC, row remap failure, NVLink, off the bus,
    # uncontained ECC, GSP): Xid 13, 31 and 43 follow an application's own fault.
    (re.compile(r"GPU is lost|fallen off the bus|"
                r"\bXid\b \([^)]*\): (?:48|64|74|79|95|119|120)\b", re.I), "GPU lost"),
    (re.compile(r"NVLink error|cudaErrorNvlinkUncorrectable", re.I), "NVLink error"),
    (re.compile(r"no CUDA-capable device is detected|CUDA-capable device\(s\) is/are busy or "
                r"unavailable|CUDA driver initialization failed|cudaErrorDevicesUnavailable", re.I),
     "no usable GPU"),
    (re.compile(r"unhandled cuda error", re.I), "NCCL: unhandled cuda error"),
)
LINK = (
    (re.compile(r"unhandled system error", re.I), "NCCL: unhandled system error"),
    # NCCL's WARN level only: with NCCL_DEBUG=INFO a healthy start logs NET/IB probes and
    # fallbacks ("... failed, ...") at INFO.
    (re.compile(r"\bWARN\b.*NET/IB\b.*\b(?:error|failed)|IBV_WC_\w+_ERR", re.I),
     "InfiniBand error"),
)
# Every pattern needs one of these words: one cheap scan spares most chunks the regexes.
_WORDS = ("rror", "ECC", "Xid", "lost", "bus", "device", "failed", "IBV_WC")


# A Python warning is not a failure: torch warns "CUDA initialization: CUDA driver
# initialization failed" on a CPU-only host, where a CPU job runs fine.
_WARNING = re.compile(r"\w*Warning: ")


def cause(line: str) -> tuple[str, bool] | None:
    """(what it looks like, whether it is the node's own device) for one line, or None."""
    if _WARNING.search(line):
        return None
    for table, device in ((DEVICE, True), (LINK, False)):
        for pattern, what in table:
            if pattern.search(line):
                return f"{what}: {line.strip()[:160]}", device
    return None


def may_matter(text: str) -> bool:
    """Whether text holds a word every pattern needs: most chunks are spared the regexes."""
    return any(w in text for w in _WORDS)


def first_cause(lines: list[str], device_only: bool = False) -> tuple[str, bool] | None:
    """The first hardware-looking line among lines (device_only: the first DEVICE one), as
    cause() says it, or None."""
    if not may_matter("\n".join(lines)):
        return None
    for line in lines:
        found = cause(line)
        if found and (found[1] or not device_only):
            return found
    return None


def hardware_nodes(seen: dict[int, tuple[str, bool]], first_failure: int | None,
                   torn_down: set[int], lost: set[int] = frozenset(),
                   nodes: int = 0) -> dict[int, str]:
    """{rank: cause} of the nodes a restart should not reuse: seen holds each node's first
    hardware-looking line. A LINK cause counts only for the first failure, only when mlaunch
    had not torn that node down and no node was lost (a lost node's peers print link errors
    as their connections break, often before the loss is seen: the loss explains them). A
    DEVICE cause on every one of several nodes is the job's, not a node's (a wrong
    CUDA_VISIBLE_DEVICES, NCCL out of GPU memory): it counts for none."""
    device = {r for r, (_, d) in seen.items() if d}
    if nodes > 1 and len(device) >= nodes:
        device = set()
    link = first_failure not in torn_down and not lost
    return {r: why for r, (why, own) in seen.items()
            if (r in device if own else r == first_failure and link)}


def of_result(result) -> dict[int, str]:
    """hardware_nodes() of an attempt's JobResult (session/outcome.py)."""
    torn = {o.rank for o in result.nodes if o.terminated}
    lost = {o.rank for o in result.nodes if o.exit is not None and o.exit.lost and not o.terminated}
    return hardware_nodes(result.hardware, result.first_failure, torn, lost, len(result.nodes))

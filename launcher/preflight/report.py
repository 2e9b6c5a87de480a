"""Preflight results and how a person reads them: one table, one fix line per failure, JSON."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Literal

Status = Literal["pass", "fail", "skip"]
SYMBOL = {"pass": "✓", "fail": "✗", "skip": "–"}
_ANSI = {"pass": "32", "fail": "31", "skip": "2"}

# Table rows, in the order someone debugging a cluster would look: can I log in, is the
# software right, are the devices there, can the nodes talk, is the disk there, then the
# end-to-end proof.
CHECKS = (
    "ssh", "allocation", "software/python", "software/versions", "software/jit-lock", "gpu",
    "network/port-free", "network/master-addr", "network/port-reachable", "network/hostname", "network/ifname",
    "storage/output", "storage/shared", "storage/inputs", "storage/staged",
    "clock", "container/shm", "collective", "collective/transport",
)


@dataclass(frozen=True)
class CheckResult:
    """One check on one node (node None: a check of the whole cluster)."""

    check: str
    node: int | None
    host: str | None
    status: Status
    detail: str
    fix: str | None = None


@dataclass(frozen=True)
class Report:
    """Every result of one preflight run and how long it took."""

    results: tuple[CheckResult, ...]
    seconds: float
    stack: dict = field(default_factory=dict)   # majority versions: torch, transformers, ...
    memory: dict = field(default_factory=dict)  # gpu_mib, model_config: for batch planning

    @property
    def ok(self) -> bool:
        """True when nothing failed (skips do not fail a run)."""
        return not any(r.status == "fail" for r in self.results)

    @property
    def failures(self) -> list[CheckResult]:
        """Every ✗ result."""
        return [r for r in self.results if r.status == "fail"]

    def get(self, check: str, node: int | None) -> CheckResult | None:
        """The result of one check on one node, if that check ran there."""
        return next((r for r in self.results if r.check == check and r.node == node), None)

    def table(self, color: bool = False) -> str:
        """The human view: a row per check, a column per node, then a fix per ✗."""
        nodes = self._nodes()
        width = max([len(c) for c in self._rows()] + [5]) + 2
        cols = [max(len(f"node{i}"), len(h or "")) + 2 for i, h in nodes]
        lines = [("check".ljust(width) + "".join(f"node{i}".ljust(w) for (i, _), w in zip(nodes, cols))).rstrip(),
                 (" " * width + "".join((h or "").ljust(w) for (_, h), w in zip(nodes, cols))).rstrip()]
        for check in self._rows():
            lines.append((check.ljust(width) + self._cells(check, nodes, cols, color)).rstrip())
        lines += self._fix_lines(color)
        lines.append(self._summary(len(nodes)))
        return "\n".join(lines) + "\n"

    def to_json(self, mask=lambda data: data) -> str:
        """Machine-readable: ok, seconds and every result with its fix; mask(data) before it
        is serialised (a secret escaped by json.dumps would escape a mask of the text)."""
        return json.dumps(mask({"ok": self.ok, "seconds": round(self.seconds, 3),
                                "results": [asdict(r) for r in self.results]}), indent=2)

    def _nodes(self) -> list[tuple[int, str | None]]:
        """(rank, host) of every column, in rank order."""
        seen: dict[int, str | None] = {}
        for r in self.results:
            if r.node is not None:
                seen.setdefault(r.node, r.host)
        return sorted(seen.items())

    def _rows(self) -> list[str]:
        """The checks present, in table order."""
        present = {r.check for r in self.results}
        return [c for c in CHECKS if c in present] + sorted(present - set(CHECKS))

    def _cells(self, check: str, nodes: list, cols: list[int], color: bool) -> str:
        """One row's cells after its label."""
        whole = self.get(check, None)
        if whole is not None:  # cluster-wide result: one symbol and its figure, spanning
            return _paint(SYMBOL[whole.status], whole.status, color) + " " + whole.detail
        out = []
        for (i, _), w in zip(nodes, cols):
            r = self.get(check, i)
            # A blank cell: the check does not apply to that node (e.g. port-free off the master).
            sym = SYMBOL[r.status] if r else ""
            out.append(_paint(sym, r.status, color) + " " * (w - len(sym)) if r else " " * w)
        return "".join(out)

    def _fix_lines(self, color: bool) -> list[str]:
        """The ✗ lines under the table, each followed by its fix."""
        # Identical failures on several nodes (same detail and fix) are listed once.
        groups: dict[tuple, list[CheckResult]] = {}
        for r in self.failures:
            groups.setdefault((r.check, r.detail, r.fix), []).append(r)
        lines = [""] if groups else []
        for (check, detail, fix), rs in groups.items():
            where = ", ".join(f"node{r.node} {r.host}" for r in rs if r.node is not None) or "cluster"
            lines.append(f"{_paint(SYMBOL['fail'], 'fail', color)} {check} on {where}: {detail}")
            if fix:
                lines.append(f"    fix: {fix}")
        return lines

    def _summary(self, n_nodes: int) -> str:
        """The last line: how many nodes, how long, what failed."""
        failed = sorted({r.check for r in self.failures}, key=_order)
        head = f"\npreflight on {n_nodes} node{'s' if n_nodes != 1 else ''} in {self.seconds:.1f}s: "
        if not failed:
            return head + "all checks passed"
        return head + f"{len(failed)} check{'s' if len(failed) != 1 else ''} failed ({', '.join(failed)})"


def _order(check: str) -> int:
    """Row position of a check (unknown checks last)."""
    return CHECKS.index(check) if check in CHECKS else len(CHECKS)


def _paint(text: str, status: str, color: bool) -> str:
    """text in the status colour when color is on."""
    return f"\033[{_ANSI[status]}m{text}\033[0m" if color and text else text


def sort_results(results: list[CheckResult]) -> tuple[CheckResult, ...]:
    """Table order: by check, then node (cluster-wide results first)."""
    return tuple(sorted(results, key=lambda r: (_order(r.check), -1 if r.node is None else r.node)))

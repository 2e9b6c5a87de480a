"""Clock offset of each node from the launcher, Cristian-style, from a few timed round trips
(fewer where the first already proves the clock good).

offset = remote_time - (t_send + t_recv) / 2. The remote reading happened somewhere inside
the round trip, so the true offset lies within +-(t_recv - t_send) / 2 of that estimate;
the sample with the shortest round trip is the tightest. A node fails only when even the
most favourable reading is beyond the limit: a slow login shell must not fail a good clock.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .probe import Ctx, on_nodes, sh_script
from .report import CheckResult

SAMPLES = 3
_TIME = re.compile(r"^\d{9,}\.\d+$")


@dataclass(frozen=True)
class Sample:
    """One round trip: launcher send/receive times and the node's reading, all in epoch seconds."""

    t_send: float
    t_recv: float
    remote: float

    @property
    def offset_ms(self) -> float:
        return (self.remote - (self.t_send + self.t_recv) / 2) * 1000

    @property
    def uncertainty_ms(self) -> float:
        return (self.t_recv - self.t_send) / 2 * 1000


def best(samples: list[Sample]) -> Sample:
    """The sample with the shortest round trip: the least room for asymmetric delays."""
    return min(samples, key=lambda s: s.t_recv - s.t_send)


def verdict(samples: list[Sample], max_ms: float) -> tuple[bool, float, float]:
    """(within limit, offset ms, +-uncertainty ms) of the best sample."""
    s = best(samples)
    return abs(s.offset_ms) - s.uncertainty_ms <= max_ms, s.offset_ms, s.uncertainty_ms


def parse_remote(output: str) -> float | None:
    """The node's `date +%s.%N` reading: the last line that looks like one (login noise aside)."""
    for line in reversed(output.splitlines()):
        if _TIME.match(line.strip()):
            return float(line.strip())
    return None


def settled(samples: list[Sample], max_ms: float) -> bool:
    """Whether a sample already proves the clock good: its whole window (the offset, plus or
    minus the uncertainty) lies within the limit, so no further sample could fail it."""
    return any(abs(s.offset_ms) + s.uncertainty_ms <= max_ms for s in samples)


def suspect(samples: list[Sample], max_ms: float) -> bool:
    """Whether even the most favourable reading so far is beyond half the limit: only then
    are more samples worth their sessions. Where every node is asked at once, a sample's
    reading comes late in its round trip (the client's start and the node's session come
    before it, the way back is short), so a synced clock reads about +uncertainty, and further
    rounds, as loose, prove nothing more (bench/results/preflight-cut-2026-12-06)."""
    s = best(samples) if samples else None
    return s is not None and abs(s.offset_ms) - s.uncertainty_ms > max_ms / 2


def sample(ctx: Ctx, got: dict[int, list[Sample] | str] | None = None,
           rounds: int = SAMPLES) -> dict[int, list[Sample] | str]:
    """Up to `rounds` rounds, each on every node still unsettled, in parallel; per node its
    samples or why none. got: the samples of earlier rounds, added to.

    A node whose sample proves its clock (settled) is not asked again; after the first round
    neither is one that is not suspect. Each round is a session on every node asked: on a
    busy machine no clock settled in three rounds, and those rounds slowed the facts probe
    they ran beside (bench/results/preflight-cut-2026-12-06). The preflight takes the first round beside the facts probe and
    any other after it."""
    got = {r: [] for r in ctx.live} if got is None else got
    limit = ctx.pf.max_clock_offset_ms
    for _ in range(rounds):
        ranks = [r for r in ctx.live if isinstance(got[r], list) and not settled(got[r], limit)
                 and (not got[r] or suspect(got[r], limit))]
        if not ranks:
            break
        outs = on_nodes(ctx, lambda r: sh_script("clock"), ctx.pf.check_timeout_s, ranks)
        for r, o in outs.items():
            remote = parse_remote(o.output)
            if remote is None:
                got[r] = got[r] or f"no time reading ({o.why()})"
            elif isinstance(got[r], list):
                got[r].append(Sample(o.t_send, o.t_recv, remote))
    return got


def check(ctx: Ctx, samples: dict[int, list[Sample] | str]) -> list[CheckResult]:
    """Per node: |offset| within preflight.max_clock_offset_ms."""
    limit = ctx.pf.max_clock_offset_ms
    out = []
    for r in ctx.live:
        host, s = ctx.nodes[r].host, samples.get(r)
        if not s or isinstance(s, str):
            out.append(CheckResult("clock", r, host, "skip", s or "no time reading"))
            continue
        ok, off, unc = verdict(s, limit)
        text = f"{off:+.1f} ms from the launcher (±{unc:.1f} ms)"
        if ok:
            out.append(CheckResult("clock", r, host, "pass", text))
        else:
            out.append(CheckResult("clock", r, host, "fail", f"clock is {text}, limit {limit:g} ms",
                                   f"sync the clock on {host}: enable NTP (timedatectl set-ntp true; "
                                   "chronyc makestep), and on the launcher too if every node is off"))
    return out

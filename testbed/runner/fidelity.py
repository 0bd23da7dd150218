"""What "a link's round trip is right" means, once, for `testbed probe` and bench/link_fidelity.py alike.

A DC pair's round trip is held against the round trip its links apply plus the unshaped round trip of the path:
each DC's own round trip (node to node inside it, with the same pinger) is what the machine takes to carry a
packet with no link in the way, and a pair's floor is the mean of its two DCs' (the round trip crosses each DC's
access path once each way). The floors are measured at the same time as the pair's pings, by pingers of their own
(testbed.runner.probe.floors_beside): what the machine takes moves with its load (a vCPU that idles wakes up
slower than a busy one), and a floor measured a few seconds earlier missed that by up to 0.2 ms here (CHANGELOG,
2026-11-29). The error is the measured median less that.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

DEFINITION = ("error = measured RTT median - (applied RTT + floor); floor = the mean of the two DCs' own unshaped "
              "round trips (node to node inside each DC, same pinger, measured at the same time as the pair's pings); "
              "pings randomly spaced around their interval")


@dataclass(frozen=True)
class RoundTrip:
    """One measured round trip against what it should be (ms)."""

    applied_ms: float  # the latency of every link end on the round trip that a running mechanism delays
    floor_ms: float | None  # the unshaped round trip of the pair's two DCs (None: not measured)
    expected_ms: float  # applied + floor
    p50_ms: float | None
    p99_ms: float | None
    error_ms: float | None  # p50 - expected


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile of `values`, by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def pair_floor_ms(src_floor_ms: float | None, dst_floor_ms: float | None) -> float | None:
    """A pair's unshaped round trip: the mean of its two DCs' own (one of them where only one was measured)."""
    known = [value for value in (src_floor_ms, dst_floor_ms) if value is not None]
    return statistics.fmean(known) if known else None


def round_trip(applied_ms: float, floor_ms: float | None, rtts_ms: list[float]) -> RoundTrip:
    """A pair's measured round trips (ms) held against applied + floor."""
    expected = applied_ms + (floor_ms or 0.0)
    p50 = statistics.median(rtts_ms) if rtts_ms else None
    return RoundTrip(applied_ms, floor_ms, expected, p50, percentile(rtts_ms, 0.99) if rtts_ms else None,
                     p50 - expected if p50 is not None else None)


def below_compensation(key: str, figures: dict) -> str:
    """A note where a direction's delay is below what its delay line can give ("" where it is not)."""
    latency, least = figures.get("latency_ms"), figures.get("least_ms")
    if latency is None or least is None or latency <= 0 or latency >= least:
        return ""
    return f"{key}: {latency:.3f} ms is below the delay line's own {least:.3f} ms, not compensated"

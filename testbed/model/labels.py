"""Sweep keys and values as people read them, for terminal, report and plots: 'links[east,west].latency' ->
'east–west latency', '20ms' -> '20 ms', '1000km' -> '1,000 km', 'workload.micro_batches' -> 'micro-batches'."""

from __future__ import annotations

from typing import Any

from testbed.spec import units
from testbed.spec.experiment import LINK_KEY

LINK_FIELDS = {"latency": "latency", "distance": "distance", "bandwidth": "bandwidth", "jitter": "jitter",
               "loss": "loss"}


def key_label(key: str) -> str:
    """'links[east,west].latency' -> 'east–west latency'; 'links[*].latency' -> 'latency of every link';
    'workload.micro_batches' -> 'micro-batches'."""
    match = LINK_KEY.match(key)
    if match:
        ends, field = match.group(1), LINK_FIELDS[match.group(2)]
        if ends == "*":
            return f"{field} of every link"
        a, b = (end.strip() for end in ends.split(","))
        return f"{a}–{b} {field}"
    return key.split(".", 1)[-1].replace("_", "-")


def _number(value: float) -> str:
    return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"


def duration_label(seconds: float) -> str:
    """0.02 -> '20 ms'."""
    if seconds == 0:
        return "0 ms"
    return (f"{_number(seconds * 1e6)} µs" if seconds < 1e-3 else
            f"{_number(seconds * 1e3)} ms" if seconds < 1 else f"{_number(seconds)} s")


def distance_label(metres: float) -> str:
    """1e6 -> '1,000 km'."""
    return f"{_number(metres / 1e3)} km" if metres >= 1e3 else f"{_number(metres)} m"


def rate_label(bits_per_second: float) -> str:
    """1.6e12 -> '1.6 Tbit/s'."""
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits_per_second >= scale:
            return f"{_number(bits_per_second / scale)} {unit}"
    return f"{_number(bits_per_second)} bit/s"


def value_label(key: str, value: Any) -> str:
    """A sweep value with its unit, spaced and with thousands separators: '20 ms', '1,000 km', '10 Gbit/s', '0.1 %'."""
    match = LINK_KEY.match(key)
    if not match:
        return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
    field = match.group(2)
    try:
        if field in ("latency", "jitter"):
            return duration_label(units.parse_duration(value))
        if field == "distance":
            return distance_label(units.parse_distance(value))
        if field == "bandwidth":
            return rate_label(units.parse_rate(value))
        return f"{_number(units.parse_fraction(value) * 100)} %"
    except ValueError:
        return str(value)


def point_label(sweep: dict[str, Any]) -> str:
    """A sweep point for people: 'east–west latency 20 ms, micro-batches 4' ('every cell' without a sweep)."""
    return ", ".join(f"{key_label(k)} {value_label(k, v)}" for k, v in sweep.items()) or "every cell"

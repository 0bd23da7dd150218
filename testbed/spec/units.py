"""Parse the unit strings users write ("10ms", "1000km", "400gbit", "0.1%") into plain SI numbers.

Every parser takes a string (or a bare number, read in the base unit) and returns a float in:
seconds, metres, bits per second, bytes or a fraction in [0, 1]. A bad value raises ValueError with a
message short enough to end up in a one-line spec error.
"""

from __future__ import annotations

import re

# Light in fibre: refractive index ~1.47, so about 4.9 microseconds per km, one way.
FIBRE_SECONDS_PER_METRE = 4.9e-6 / 1000.0

_NUMBER = r"([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_PATTERN = re.compile(r"^\s*" + _NUMBER + r"\s*([a-zA-Z%/]*)\s*$")

_DURATION = {"": 1.0, "s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "m": 60.0,
             "min": 60.0}
_DISTANCE = {"": 1.0, "m": 1.0, "km": 1e3, "mi": 1609.344}
_RATE = {"": 1.0, "bit": 1.0, "bps": 1.0, "kbit": 1e3, "kbps": 1e3, "mbit": 1e6, "mbps": 1e6, "gbit": 1e9,
         "gbps": 1e9, "tbit": 1e12, "tbps": 1e12}
_SIZE = {"": 1.0, "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1024.0, "mib": 1024.0**2,
         "gib": 1024.0**3}


def _parse(value: str | int | float, table: dict[str, float], what: str, example: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"expected a {what} such as {example!r}, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value) * table[""]
    match = _PATTERN.match(str(value))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in table:
        raise ValueError(f"expected a {what} such as {example!r}, got {value!r}")
    return float(match.group(1)) * table[unit]


def _non_negative(number: float, value: object, what: str) -> float:
    if number < 0:
        raise ValueError(f"{what} must not be negative, got {value!r}")
    return number


def parse_duration(value: str | int | float) -> float:
    """'10ms' -> 0.01 (seconds). A bare number is seconds."""
    return _non_negative(_parse(value, _DURATION, "duration", "10ms"), value, "duration")


def parse_distance(value: str | int | float) -> float:
    """'1000km' -> 1e6 (metres). A bare number is metres."""
    return _non_negative(_parse(value, _DISTANCE, "distance", "1000km"), value, "distance")


def parse_rate(value: str | int | float) -> float:
    """'400gbit' -> 4e11 (bits per second). A bare number is bits per second; must be positive."""
    rate = _parse(value, _RATE, "bandwidth", "1gbit")
    if rate <= 0:
        raise ValueError(f"bandwidth must be positive, got {value!r}")
    return rate


def parse_fraction(value: str | int | float) -> float:
    """'0.1%' -> 0.001. A bare number is a fraction (0.001); must lie in [0, 1]."""
    if isinstance(value, str) and value.strip().endswith("%"):
        number = _parse(value.strip()[:-1], {"": 0.01}, "percentage", "0.1%")
    else:
        number = _parse(value, {"": 1.0}, "fraction or percentage", "0.1%")
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"must lie between 0% and 100%, got {value!r}")
    return number


def parse_size(value: str | int | float) -> float:
    """'4MiB' -> 4194304 (bytes). A bare number is bytes."""
    return _non_negative(_parse(value, _SIZE, "size", "4MiB"), value, "size")


def fibre_delay(distance_m: float) -> float:
    """One-way propagation delay in seconds over `distance_m` metres of fibre (4.9 us/km)."""
    return distance_m * FIBRE_SECONDS_PER_METRE


def format_duration(seconds: float) -> str:
    """0.0105 -> '10.5ms'; for tables and plans."""
    if seconds == 0:
        return "0"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.4g}us"
    if seconds < 1:
        return f"{seconds * 1e3:.4g}ms"
    return f"{seconds:.4g}s"


def format_rate(bits_per_second: float | None) -> str:
    """1e9 -> '1gbit'; None -> 'unlimited'."""
    if bits_per_second is None:
        return "unlimited"
    for unit, scale in (("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits_per_second >= scale:
            return f"{bits_per_second / scale:.4g}{unit}"
    return f"{bits_per_second:.4g}bit"


def format_fraction(fraction: float) -> str:
    """0.001 -> '0.1%'."""
    return f"{fraction * 100:.4g}%"

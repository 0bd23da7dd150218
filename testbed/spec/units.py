"""Parse the quantities users write ("10ms", "1000km", "400gbit", "0.1%") into plain SI numbers, and the one
table of what is accepted (units_table_markdown, generated into the docs).

Every quantity carries its unit and no unit reads two ways: a bare number for a duration, distance, rate or
size is refused (zero excepted: it is zero in every unit), `5m` as a duration is refused (minutes or metres?),
and so is `10gbps` (gigabits as networking writes it, gigabytes as tc reads it). Every parser returns a float in
seconds, metres, bits per second, bytes or a fraction in [0, 1]; a bad value raises ValueError with a one-line
problem, which the spec prefixes with file and field. `si=True` reads a bare number in the base unit: for data
testbed wrote itself (a manifest's or state file's model_dump), never for what a user typed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Light in fibre: refractive index ~1.47, so about 4.9 microseconds per km, one way.
FIBRE_SECONDS_PER_METRE = 4.9e-6 / 1000.0

# Bounds of what a real link can have (see BOUNDS for where each comes from).
MAX_ONE_WAY_DELAY = 0.300  # s
UNUSUAL_ONE_WAY_DELAY = 0.150  # s
MAX_DISTANCE = 40_000e3  # m
QUEUE_MEMORY_SHARE = 0.25  # of MemTotal, for one direction's queue

_NUMBER = r"([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_PATTERN = re.compile(r"^\s*" + _NUMBER + r"\s*([a-zA-Zµ%/]*)\s*$")

TC_RATES = "man tc, PARAMETERS/RATES: 'kbit' is kilobits per second, 'kbps' kilobytes per second"


@dataclass(frozen=True)
class Kind:
    """One kind of quantity: its accepted units (spelling -> factor to the base unit, case-insensitive unless
    `exact_case`), an example, and the spellings refused because they read two ways (spelling -> why)."""

    name: str
    base: str
    units: dict[str, float]
    example: str
    two_ways: dict[str, str]
    two_ways_in_short: str = ""  # why `two_ways` are refused, for the table
    exact_case: bool = False

    def lookup(self, unit: str) -> float | None:
        return self.units.get(unit if self.exact_case else unit.lower())

    def spellings(self) -> str:
        return ", ".join(self.units)


def _bps(prefix: str, word: str) -> str:
    return (f"reads two ways: {word}bits per second as networking writes it, or {word}bytes per second as tc reads "
            f"it ({TC_RATES}); write {{n}}{prefix}bit for bits (or {{n8}}{prefix}bit for bytes)")


DURATION = Kind("duration", "seconds", {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0,
                                        "h": 3600.0},
                "5ms", {"m": "reads two ways: minutes, or metres (a distance); write {n}min for minutes"},
                "minutes or metres")
DISTANCE = Kind("distance", "metres", {"m": 1.0, "km": 1e3, "mi": 1609.344}, "1000km", {})
RATE = Kind("rate", "bits per second",
            {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
             "bit/s": 1.0, "kbit/s": 1e3, "mbit/s": 1e6, "gbit/s": 1e9, "tbit/s": 1e12},
            "1gbit", {"bps": _bps("", ""), "kbps": _bps("k", "kilo"), "mbps": _bps("m", "mega"),
                      "gbps": _bps("g", "giga"), "tbps": _bps("t", "tera")},
            "bits as networking writes them, bytes as tc reads them (man tc: 'kbps' is kilobytes per second)")
SIZE = Kind("size", "bytes", {"B": 1.0, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 1024.0,
                              "MiB": 1024.0**2, "GiB": 1024.0**3},
            "4MiB", {"b": "reads two ways: bits or bytes; write {n}B for bytes",
                     **{p + "b": f"reads two ways: {w}bits or {w}bytes (tc reads '{p}b' as {w}bytes); write "
                                 f"{{n}}{p.upper() if p != 'k' else 'k'}B or {{n}}{p.upper()}iB for bytes"
                        for p, w in (("k", "kilo"), ("m", "mega"), ("g", "giga"))}},
            "bits or bytes (tc reads 'mb' as megabytes)", exact_case=True)
KINDS = (DURATION, DISTANCE, RATE, SIZE)


def _written(value: object) -> str:
    """A value as the user wrote it, for a message."""
    if isinstance(value, str):
        return repr(value.strip())
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _parse(value: object, kind: Kind, si: bool, unit_hint: str = "") -> float:
    accepted = f"a {kind.name} takes {kind.spellings()}"
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"expected a {kind.name} such as {kind.example}, got {_written(value)}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = _PATTERN.match(value)
        if match is None:
            raise ValueError(f"expected a {kind.name} such as {kind.example}, got {_written(value)} ({accepted})")
        number, unit = float(match.group(1)), match.group(2)
    if unit == "":
        if si or number == 0:
            return number
        if unit_hint:  # the unit such a number most likely meant (a timeout's seconds, not milliseconds)
            example = f"{_written(number)}{unit_hint}"
        else:
            example = f"{_written(number)}{kind.example.lstrip('0123456789.')}" if number < 1e4 else kind.example
        meant = f"; as bits per second it would be {format_rate(number)}" if kind is RATE and number > 0 else ""
        raise ValueError(f"{_written(value)} has no unit: write it with one, e.g. {example} ({accepted}{meant})")
    factor = kind.lookup(unit)
    if factor is not None:
        return number * factor
    why = kind.two_ways.get(unit.lower())
    if why is not None:
        raise ValueError(f"{_written(value)} {why.format(n=_written(number), n8=_written(number * 8))}")
    raise ValueError(f"expected a {kind.name} such as {kind.example}, got {_written(value)} ({accepted})")


def _non_negative(number: float, value: object, what: str) -> float:
    if number < 0:
        raise ValueError(f"a {what} cannot be negative, got {_written(value)}")
    return number


def parse_duration(value: str | int | float, *, si: bool = False, unit_hint: str = "") -> float:
    """'10ms' -> 0.01 (seconds). `unit_hint`: the unit a bare number's example gets ("s" for a timeout: `120`
    is refused with "e.g. 120s", where a link's latency suggests ms)."""
    return _non_negative(_parse(value, DURATION, si, unit_hint), value, "duration")


def parse_delay(value: str | int | float, *, si: bool = False) -> float:
    """A link's one-way delay: a duration no longer than MAX_ONE_WAY_DELAY."""
    seconds = parse_duration(value, si=si)
    if seconds > MAX_ONE_WAY_DELAY:
        raise ValueError(f"{_written(value)} one way is longer than any real link has: a geostationary satellite hop "
                         f"is at most about 280 ms, so testbed refuses more than {format_duration(MAX_ONE_WAY_DELAY)}")
    return seconds


def parse_distance(value: str | int | float, *, si: bool = False) -> float:
    """'1000km' -> 1e6 (metres), at most MAX_DISTANCE."""
    metres = _non_negative(_parse(value, DISTANCE, si), value, "distance")
    if metres > MAX_DISTANCE:
        raise ValueError(f"{_written(value)} is longer than any fibre route on Earth: the circumference is "
                         f"40,000 km and the longest cable system 39,000 km, so testbed refuses more than 40000km")
    return metres


def parse_rate(value: str | int | float, *, si: bool = False) -> float:
    """'400gbit' -> 4e11 (bits per second); must be positive."""
    rate = _parse(value, RATE, si)
    if rate <= 0:
        raise ValueError(f"a bandwidth must be more than 0, got {_written(value)} (leave it out for an unshaped link)")
    return rate


def parse_size(value: str | int | float, *, si: bool = False) -> float:
    """'4MiB' -> 4194304 (bytes)."""
    return _non_negative(_parse(value, SIZE, si), value, "size")


def parse_fraction(value: str | int | float, *, si: bool = False) -> float:
    """'0.1%' -> 0.001; a bare number is a fraction of 1 (0.001). Must lie in [0, 1]."""
    if isinstance(value, str) and value.strip().endswith("%"):
        match = _PATTERN.match(value.strip()[:-1])
        if match is None or match.group(2):
            raise ValueError(f"expected a percentage such as 0.1%, got {_written(value)}")
        number = float(match.group(1)) / 100
    else:
        match = _PATTERN.match(str(value)) if isinstance(value, (str, int, float)) else None
        if isinstance(value, bool) or match is None or match.group(2):
            raise ValueError(f"expected a percentage such as 0.1% (or a fraction of 1 such as 0.001), "
                             f"got {_written(value)}")
        number = float(match.group(1))
        if 1 < number <= 100:
            raise ValueError(f"{_written(value)} read as a fraction of 1 would be {number * 100:g}%: write "
                             f"{_written(value).strip(chr(39))}% (or {number / 100:g})")
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"must lie between 0% and 100%, got {_written(value)}")
    return number


def unusual_delay(seconds: float) -> str | None:
    """Why a legal one-way delay is unusual, or None."""
    if seconds <= UNUSUAL_ONE_WAY_DELAY:
        return None
    return (f"{format_duration(seconds)} one way is more than any terrestrial path has (ITU-T G.114 plans one-way "
            f"delay up to 150 ms; beyond it, satellite hops): going on")


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


# (what, bound, why and where it comes from): the docs' table of bounds
BOUNDS: tuple[tuple[str, str, str], ...] = (
    ("one-way delay of a link (latency, a fault's latency)", f"at most {format_duration(MAX_ONE_WAY_DELAY)}",
     "a geostationary satellite hop (ground-satellite-ground, 35,786 km up, slant ranges up to ~41,700 km each "
     "way) takes about 240-280 ms at the speed of light; 300 ms leaves room for the ground tails, and no "
     "terrestrial path comes near it"),
    ("one-way delay above which testbed warns (once, on stderr) and goes on",
     f"{format_duration(UNUSUAL_ONE_WAY_DELAY)}",
     "ITU-T G.114 plans one-way delay up to 150 ms; beyond it a path crosses a satellite or goes round the world"),
    ("distance of a link (fibre)", "at most 40000km",
     "the Earth's circumference is 40,075 km; the longest submarine cable system, SEA-ME-WE 3, is 39,000 km "
     "long end to end, and no two places are more than 20,004 km apart over the surface (196 ms of fibre)"),
    ("jitter of a link direction", "at most its latency",
     "jitter is the half-width of a uniform spread around the latency: more would ask for negative delays"),
    ("loss", "0% to 100%", "a share of packets"),
    ("one direction's queue (queue: N, or auto = bandwidth x round trip)",
     f"at most {QUEUE_MEMORY_SHARE:.0%} of this machine's memory (MemTotal), counted at 1514 bytes a packet",
     "a full queue is held in the kernel's memory: a link's two directions then take at most half of it"),
)


def units_table_markdown() -> str:
    """The accepted units and the bounds of a link's values, as markdown (generated into the docs)."""
    rows = ["| quantity | accepted units | example | refused |", "|---|---|---|---|"]
    for kind in KINDS:
        refused = ", ".join(f"`{spelling}`" for spelling in kind.two_ways)
        refused = f"; {refused}: read two ways, {kind.two_ways_in_short}" if refused else ""
        rows.append(f"| {kind.name} ({kind.base}) | {', '.join(f'`{u}`' for u in kind.units)} | `{kind.example}` | "
                    f"a bare number (except 0){refused} |")
    rows.append("| fraction (loss, shares) | `%`, or a bare number in [0, 1] | `0.1%` | a bare number above 1 "
                "(`5` would be 500 %: write `5%`) |")
    table = "\n".join(rows)
    bounds = ["| value | bound | why |", "|---|---|---|"]
    bounds += [f"| {what} | {bound} | {why} |" for what, bound, why in BOUNDS]
    note = ("Units are case-insensitive, except sizes (`B` is a byte; `b` alone reads two ways). A bare number is "
            "taken only where the key names its unit (`compute_ms`, `bucket_mb`, `peak_tflops`); every duration "
            "elsewhere carries its unit, an experiment's `cell_timeout` (`300s`) and the command line's "
            "(`run --timeout 10min`, `probe --seconds 2s`) too.")
    return f"{table}\n\n{note}\n\n" + "\n".join(bounds) + "\n"

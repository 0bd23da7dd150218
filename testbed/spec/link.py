"""Link parameters: what a user writes for one inter-DC link and what one direction of it carries."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from testbed.spec import units

MTU_FRAME = 1514  # bytes on the veth per full-size packet (MTU 1500 + Ethernet header)
AUTO_QUEUE_MIN = 1000  # packets; the kernel's usual default, the floor of `queue: auto`
UNSHAPED_REFERENCE_RATE = 10e9  # bits/s assumed for sizing queues of links with no bandwidth cap
MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class LinkParams:
    """One direction of a link, in SI units. bandwidth None = unshaped; queue None = auto (from BDP)."""

    latency: float = 0.0  # one-way, seconds
    bandwidth: float | None = None  # bits per second
    jitter: float = 0.0  # seconds; half-width of a uniform distribution around latency
    loss: float = 0.0  # fraction of packets dropped, 0..1
    queue: int | None = None  # packets

    def describe(self) -> dict[str, Any]:
        """Human units, for status tables and manifests."""
        return {
            "latency": units.format_duration(self.latency),
            "bandwidth": units.format_rate(self.bandwidth),
            "jitter": units.format_duration(self.jitter),
            "loss": units.format_fraction(self.loss),
            "queue": "auto" if self.queue is None else self.queue,
        }

    def queue_packets(self) -> int:
        """Packets of queue: the configured number, or `auto` = rate x (2 x (latency + jitter)), at least 1000.

        netem holds every packet in flight for the delay, and a bottleneck wants about one round trip of
        buffer; the kernel default of 1000 packets is far too small for a long fat link (10 Gbit/s x 50 ms
        is ~42k full packets).
        """
        if self.queue is not None:
            return self.queue
        rate = self.bandwidth or UNSHAPED_REFERENCE_RATE
        bdp_bytes = rate / 8 * 2 * (self.latency + self.jitter)
        return max(AUTO_QUEUE_MIN, math.ceil(bdp_bytes / MTU_FRAME))


@cache
def memory_total() -> int | None:
    """This machine's memory in bytes (MemTotal), or None where /proc/meminfo cannot be read."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_link(params: LinkParams) -> tuple[str, str] | None:
    """(field, problem) when one direction of a link asks for what no real link has, else None: jitter beyond the
    latency, or a queue whose memory would exceed QUEUE_MEMORY_SHARE of this machine's."""
    if params.jitter > params.latency:
        return "jitter", (f"{units.format_duration(params.jitter)} is more than the latency "
                          f"({units.format_duration(params.latency)}): jitter is the half-width of a spread around the "
                          "latency, so the delay would go below zero")
    memory = memory_total()
    packets = params.queue_packets()
    if memory is not None and packets * MTU_FRAME > units.QUEUE_MEMORY_SHARE * memory:
        how = (f"{packets} packets" if params.queue is not None else
               f"auto sizes it from bandwidth x round trip ({units.format_rate(params.bandwidth)} x "
               f"{units.format_duration(2 * (params.latency + params.jitter))}) to {packets} packets")
        return "queue", (f"{how}, {packets * MTU_FRAME / 1e9:,.1f} GB at full frames, more than "
                         f"{units.QUEUE_MEMORY_SHARE:.0%} of this machine's memory ({memory / 2**30:.3g} GiB): "
                         f"give a smaller queue, bandwidth or latency")
    return None


def si_numbers(info: ValidationInfo | None) -> bool:
    """Whether the data being validated was written by testbed itself, in SI numbers (validation context
    {"si": True}): a bare number is then in the base unit."""
    return bool(info is not None and isinstance(info.context, dict) and info.context.get("si"))


def unit_field(parser: Callable[[Any], float], *fields: str) -> Any:
    """A pydantic before-validator that parses unit strings of `fields` with `parser` (None stays None)."""

    def parse(cls: type, value: Any, info: ValidationInfo) -> float | None:
        return None if value is None else parser(value, si=si_numbers(info))

    return field_validator(*fields, mode="before")(classmethod(parse))


class _LinkFields(BaseModel):
    """Fields shared by a link and its `reverse:` overrides, parsed from unit strings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    latency: float | None = None
    distance: float | None = None
    bandwidth: float | None = None
    jitter: float | None = None
    loss: float | None = None
    queue: int | Literal["auto"] | None = None

    _durations = unit_field(units.parse_delay, "latency", "jitter")
    _distance = unit_field(units.parse_distance, "distance")
    _rate = unit_field(units.parse_rate, "bandwidth")
    _loss = unit_field(units.parse_fraction, "loss")

    @field_validator("queue", mode="before")
    @classmethod
    def _queue(cls, value: Any) -> int | str | None:
        if value is None or value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"expected 'auto' or a positive number of packets, got {value!r}")
        return value

    def _check_latency_or_distance(self) -> None:
        if self.latency is not None and self.distance is not None:
            raise ValueError("give latency or distance, not both")

    def overlay(self, base: LinkParams) -> LinkParams:
        """`base` with the fields set here replacing it (distance becomes fibre latency)."""
        self._check_latency_or_distance()
        latency = base.latency
        if self.distance is not None:
            latency = units.fibre_delay(self.distance)
        elif self.latency is not None:
            latency = self.latency
        queue = base.queue if self.queue is None else (None if self.queue == "auto" else self.queue)
        return LinkParams(
            latency=latency,
            bandwidth=self.bandwidth if self.bandwidth is not None else base.bandwidth,
            jitter=self.jitter if self.jitter is not None else base.jitter,
            loss=self.loss if self.loss is not None else base.loss,
            queue=queue,
        )


class ReverseOverrides(_LinkFields):
    """`reverse:` — the fields that differ in the second-to-first direction."""

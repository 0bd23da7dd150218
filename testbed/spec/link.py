"""Link parameters: what a user writes for one inter-DC link and what one direction of it carries."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from testbed.spec import units


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


def unit_field(parser: Callable[[Any], float], *fields: str) -> Any:
    """A pydantic before-validator that parses unit strings of `fields` with `parser` (None stays None)."""

    def parse(cls: type, value: Any) -> float | None:
        return None if value is None else parser(value)

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

    _durations = unit_field(units.parse_duration, "latency", "jitter")
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

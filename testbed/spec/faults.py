"""The `faults:` timeline of an experiment: what goes wrong, where and when (pure data, units parsed once).

    faults:
      - {kind: partition, between: [east, west], at: step 5, duration: 3s}
      - {kind: flap, between: [east, west], at: 4s, duration: 6s, period: 1s, down: 200ms}
      - {kind: loss-burst, between: [east, west], at: step 10, duration: 1s, loss: 20%}
      - {kind: bandwidth, between: [east, west], at: 8s, duration: 2s, bandwidth: 10mbit}
      - {kind: latency, between: [east, west], at: 8s, duration: 2s, latency: 80ms, jitter: 5ms}
      - {kind: kill, rank: 3, at: step 6}
      - {kind: kill, dc: west, at: step 4, restart_after: 5s}  # torchft: the others train on, west heals
      - {kind: straggler, rank: 2, at: step 3, duration: 5s, slowdown: 3}
      - {kind: sdc, rank: 1, at: step 8, target: gradient, bit: 30}
      - {kind: sdc, rank: 2, at: step 9, target: parameter, bit: 27, sticky: true}  # flips again when redone

`at` is `step N` (when rank 0 starts step N) or a time from the cell's first step. What each kind takes is
checked here; what needs the topology or the workload (a link, a rank, a step) is checked by
testbed.spec.experiment when the file loads."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

from testbed.spec import units
from testbed.spec.errors import written
from testbed.spec.link import si_numbers, unit_field

LINK_KINDS = ("partition", "loss-burst", "latency", "bandwidth", "flap")
RANK_KINDS = ("kill", "straggler")
SDC_KIND = "sdc"
KINDS = (*LINK_KINDS, *RANK_KINDS, SDC_KIND)
FaultKind = Literal["partition", "loss-burst", "latency", "bandwidth", "flap", "kill", "straggler", "sdc"]

# the fields each kind takes beyond kind and at (required ones first; the rest optional)
REQUIRED: dict[str, tuple[str, ...]] = {
    "partition": ("between", "duration"), "loss-burst": ("between", "duration", "loss"),
    "latency": ("between", "duration", "latency"), "bandwidth": ("between", "duration", "bandwidth"),
    "flap": ("between", "duration", "period", "down"), "kill": (),
    "straggler": ("rank", "duration", "slowdown"), "sdc": ("rank", "target", "bit"),
}
OPTIONAL: dict[str, tuple[str, ...]] = {"latency": ("jitter",), "sdc": ("tensor", "index", "sticky"),
                                         "kill": ("rank", "dc", "restart_after")}

_STEP = re.compile(r"^\s*step\s+(\d+)\s*$")


class At(BaseModel):
    """When a fault starts: at rank 0's start of step `step`, or `seconds` after the cell's first step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int | None = None
    seconds: float | None = None

    def __str__(self) -> str:
        return f"step {self.step}" if self.step is not None else units.format_duration(self.seconds or 0.0)


def parse_at(value: Any, *, si: bool = False) -> At:
    """'step 5' -> At(step=5); '4s' or '250ms' -> At(seconds=...) (a bare number of seconds only with si=True:
    data testbed wrote itself)."""
    if isinstance(value, At):
        return value
    if isinstance(value, dict):
        return At(**value)
    if isinstance(value, str):
        match = _STEP.match(value)
        if match:
            return At(step=int(match.group(1)))
        if value.strip().startswith("step"):
            raise ValueError(f"expected 'step N' with N a whole number, got {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value and not si:
        raise ValueError(f"{value:g} has no unit: write 'step {value:g}' for a step or {value:g}s for a time")
    try:
        return At(seconds=units.parse_duration(value, si=si))
    except ValueError:
        raise ValueError(f"expected 'step N' or a time such as 4s, got {written(value)}") from None


class Fault(BaseModel):
    """One fault of the timeline. Which fields a kind takes: REQUIRED and OPTIONAL."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: FaultKind
    at: At
    between: tuple[str, str] | None = None
    rank: int | None = None
    dc: str | None = None  # kill: every rank of this DC (a DC's death)
    restart_after: float | None = None  # kill: the killed ranks start again this long after (torchft strategies;
    # under any other the death ends the job: it fails, or restarts from a checkpoint as `restarts:` says)
    duration: float | None = None
    loss: float | None = None
    latency: float | None = None
    jitter: float | None = None
    bandwidth: float | None = None
    period: float | None = None
    down: float | None = None
    slowdown: float | None = None
    target: Literal["gradient", "parameter"] | None = None
    bit: int | None = None
    tensor: str | None = None
    index: int | None = None
    sticky: bool | None = None  # sdc: flipped again in every replay of the step (a defect of the rank's own)

    @field_validator("at", mode="before")
    @classmethod
    def _at(cls, value: Any, info: ValidationInfo) -> At:
        return parse_at(value, si=si_numbers(info))

    _duration = unit_field(units.parse_duration, "duration", "period", "down", "restart_after")
    _delay = unit_field(units.parse_delay, "latency", "jitter")
    _loss = unit_field(units.parse_fraction, "loss")
    _bandwidth = unit_field(units.parse_rate, "bandwidth")

    @model_validator(mode="after")
    def _fields_of_kind(self) -> Fault:
        takes = REQUIRED[self.kind] + OPTIONAL.get(self.kind, ())
        for name in REQUIRED[self.kind]:
            if getattr(self, name) is None:
                raise ValueError(f"{name}: {self.kind} needs {name}")
        for name in type(self).model_fields:
            if name not in ("kind", "at", *takes) and getattr(self, name) is not None:
                raise ValueError(f"{name}: {self.kind} does not take {name} (it takes {', '.join(takes)})")
        if self.between is not None and self.between[0] == self.between[1]:
            raise ValueError(f"between: a link joins two different DCs, got {list(self.between)}")
        if self.duration is not None and self.duration <= 0:
            raise ValueError("duration: must be longer than 0")
        if self.kind == "kill" and (self.rank is None) == (self.dc is None):
            raise ValueError("rank: a kill names a rank or a DC (dc: NAME), one of the two")
        if self.restart_after is not None and self.restart_after <= 0:
            raise ValueError("restart_after: must be longer than 0")
        if self.rank is not None and self.rank < 0:
            raise ValueError(f"rank: must not be negative, got {self.rank}")
        if self.kind == "flap":
            assert self.period is not None and self.down is not None
            if not 0 < self.down < self.period:
                raise ValueError(f"down: must lie between 0 and the period ({units.format_duration(self.period)}), "
                                 f"got {units.format_duration(self.down)}")
        if self.jitter is not None and self.latency is not None and self.jitter > self.latency:
            raise ValueError(f"jitter: {units.format_duration(self.jitter)} is more than the latency "
                             f"({units.format_duration(self.latency)}): jitter is the half-width of a spread around "
                             "the latency, so the delay would go below zero")
        if self.kind == "straggler" and self.slowdown is not None and self.slowdown <= 1:
            raise ValueError(f"slowdown: a straggler runs slower than the others: give more than 1, got {self.slowdown}")
        if self.kind == "loss-burst" and self.loss == 0:
            raise ValueError("loss: a loss burst drops something: give more than 0%")
        if self.kind == "sdc":
            if self.at.step is None:
                raise ValueError(f"at: silent data corruption is injected at a step ('step N'), got {self.at}")
            assert self.bit is not None
            if not 0 <= self.bit <= 31:
                raise ValueError(f"bit: a float32 element has bits 0-31, got {self.bit}")
            if self.index is not None and self.index < 0:
                raise ValueError(f"index: must not be negative, got {self.index}")
        return self

    @property
    def is_link(self) -> bool:
        return self.kind in LINK_KINDS

    def target_name(self) -> str:
        """What the fault hits, in words: 'east<->west', 'rank 3' or 'dc west'."""
        if self.between is not None:
            return f"{self.between[0]}<->{self.between[1]}"
        if self.dc is not None:
            return f"dc {self.dc}"
        return f"rank {self.rank}"

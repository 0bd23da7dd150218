"""The host's CPU as a bound on collectives when the ranks sharing one machine outnumber its cores.

Every rank of a testbed runs on one machine. While a collective's ranks each have a core, a message costs what the
calibrated transport says (per-call and per-segment overhead, the rate of an unshaped path: testbed.model.transport).
When more ranks than cores exchange at once (hier-dp's reduce-scatter and all-gather run in every DC at the same
time), the cores are the bottleneck: each message, and each byte of it, takes some CPU of a core (gloo's pair
threads, the copies, the wake-ups of the processes waiting on it), and the phase cannot end before all of that CPU
has been spent on the machine's cores:

    phase seconds >= (messages x message_core_s + bytes x byte_core_s) / cores

The two constants are measured apart from the runs the model is judged on, by bench/message_cost.py: DCs x g ranks
on the machine, every DC's all-to-all and all-gather of a gradient at once (what hier-dp's intra-DC phase runs),
at shapes with different messages for the same bytes; fit_host_cpu fits them by least squares. They are a
calibration's `host_cpu` field (HostCpu), measured on the calibration's machine: `cores` is that machine's.

The bound is taken as a maximum with the simulated network time, not added to it: the simulation's time already
holds the CPU a message costs a rank that has a core to itself (the calibrated per-segment overhead), so adding
would count that twice; while the cores are not saturated the network time is the larger and stands, and when they
are, the CPU is what the ranks wait for and the network's own time hides under it. No bound where the ranks do
not outnumber the cores (each rank has a core: the calibrated overheads cover it), and none from a measurement of
another machine (Calibration.host_cpu_term).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class HostCpu:
    """What a message costs the machine's CPU when its ranks outnumber its cores (fit_host_cpu)."""

    cores: int  # of the machine measured
    message_core_s: float  # core-seconds per message (one send of a collective from one rank to another)
    byte_core_s: float  # core-seconds per payload byte of those messages
    shapes: list[dict[str, Any]] = field(default_factory=list)  # the measured shapes it was fitted to
    source: dict[str, Any] = field(default_factory=dict)  # command, date, machine, where it is recorded

    def seconds(self, ranks: int, messages: float, nbytes: float) -> float:
        """The least time a phase of `messages` messages carrying `nbytes` takes with `ranks` ranks on this
        machine: their core-seconds over the cores; 0 when every rank has a core."""
        if ranks <= self.cores:
            return 0.0
        return (messages * self.message_core_s + nbytes * self.byte_core_s) / self.cores

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostCpu:
        return cls(int(data["cores"]), float(data["message_core_s"]), float(data["byte_core_s"]),
                   list(data.get("shapes", [])), dict(data.get("source", {})))


def all_to_all_load(sizes: Iterable[int], nbytes: float) -> tuple[int, float]:
    """(messages, payload bytes) of an all-to-all of `nbytes` per rank in every group at once (groups of `sizes`
    ranks): each rank sends 1/g of its buffer to each of the g - 1 others."""
    sizes = list(sizes)
    return sum(g * (g - 1) for g in sizes), sum((g - 1) * nbytes for g in sizes)


def all_gather_load(sizes: Iterable[int], shard: float) -> tuple[int, float]:
    """(messages, payload bytes) of an all-gather of a `shard` from every rank in every group at once: gloo's ring,
    g - 1 steps, one shard a rank a step."""
    sizes = list(sizes)
    return sum(g * (g - 1) for g in sizes), sum(g * (g - 1) * shard for g in sizes)


def shape_load(dcs: int, group: int, elements: int) -> tuple[int, float]:
    """(messages, bytes) bench/message_cost.py's shape sends: every DC's all-to-all of a gradient of `elements`
    floats (cut to a multiple of the group) and all-gather of its shards: DCs x 2g(g-1) messages."""
    flat = 4 * (elements - elements % group)
    a = all_to_all_load([group] * dcs, flat)
    b = all_gather_load([group] * dcs, flat / group)
    return a[0] + b[0], a[1] + b[1]


def fit_host_cpu(shapes: Sequence[Mapping[str, Any]], cores: int,
                 source: Mapping[str, Any] | None = None) -> HostCpu:
    """The two constants from measured shapes (each: ranks, messages, bytes, phase_s): least squares of the
    core-seconds each phase took (phase_s x cores) over messages and bytes, on the shapes whose ranks outnumber the
    cores (the others' time is not the CPU's). Shapes with different messages for about the same bytes (4x16 and
    2x32) separate the two; a constant fitted below 0 is set to 0 and the other refitted alone."""
    rows = [s for s in shapes if int(s["ranks"]) > cores]
    if not rows:
        raise ValueError(f"no measured shape has more ranks than the {cores} cores")
    xs = [(float(s["messages"]), float(s["bytes"])) for s in rows]
    ys = [float(s["phase_s"]) * cores for s in rows]
    mm = sum(m * m for m, _ in xs)
    bb = sum(b * b for _, b in xs)
    mb = sum(m * b for m, b in xs)
    my = sum(m * y for (m, _), y in zip(xs, ys))
    by = sum(b * y for (_, b), y in zip(xs, ys))
    det = mm * bb - mb * mb
    message, byte = ((my * bb - by * mb) / det, (by * mm - my * mb) / det) if det > 0 else (-1.0, -1.0)
    if message < 0 or byte < 0:  # one of them alone
        per_message, per_byte = (my / mm if mm else 0.0), (by / bb if bb else 0.0)
        alone = [(per_message, 0.0), (0.0, per_byte)]
        message, byte = min(alone, key=lambda c: sum((y - c[0] * m - c[1] * b) ** 2 for (m, b), y in zip(xs, ys)))
    return HostCpu(cores, message, byte, [dict(s) for s in shapes], dict(source or {}))

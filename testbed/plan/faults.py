"""A cell's fault schedule as pure functions of the experiment's `faults:` (testbed.spec.faults).

Each fault becomes actions on a clock: `apply` and `clear` (a flap: one pair per down window), each anchored
to rank 0's start of a step or to the cell's first step, plus an offset in seconds. What a link fault does to
a direction's parameters (`impaired`) is pure too: a partition and a flap's down window drop every packet (but
the probe's marked ones, testbed.plan.delayline.UNSHAPED_DSCP, which cross every link end undelayed)
(loss 100 %, on the link ends, by netem or the delay line), the others replace one field. Every fault gets a
seed derived from (workload seed, cell, fault index), so a cell replays the same faults: it picks the element
an SDC flips when the experiment names none."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass

from testbed.plan.network import direction_key
from testbed.spec.faults import Fault
from testbed.spec.link import LinkParams

Anchor = int | None  # a step of rank 0, or None: the cell's first step


@dataclass(frozen=True)
class FaultAction:
    """Apply or clear fault `fault` at `offset_s` seconds after its anchor (rank 0's start of `step`, or the
    cell's first step when `step` is None)."""

    fault: int  # index in the experiment's faults
    action: str  # "apply" | "clear"
    step: Anchor
    offset_s: float
    window: int = 0  # a flap's down window, counted from 0

    def sort_key(self) -> tuple:
        return (self.step if self.step is not None else -1, self.offset_s, self.action != "clear", self.fault)


def fault_seed(workload_seed: int, cell_id: str, index: int) -> int:
    """A 63-bit seed for fault `index` of cell `cell_id`: the same on every replay of the cell."""
    digest = hashlib.sha256(f"{workload_seed}/{cell_id}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def actions_of(index: int, fault: Fault) -> list[FaultAction]:
    """The apply/clear actions of one fault. SDC is injected by the workload at its step: no actions here; a
    kill is applied and never cleared, unless it restarts what it killed (`restart_after`: its clear)."""
    step, start = fault.at.step, fault.at.seconds or 0.0
    if fault.kind == "sdc":
        return []
    if fault.kind == "kill":
        restart = [FaultAction(index, "clear", step, start + fault.restart_after)] if fault.restart_after else []
        return [FaultAction(index, "apply", step, start), *restart]
    assert fault.duration is not None
    if fault.kind == "flap":
        assert fault.period is not None and fault.down is not None
        out = []
        for window in range(math.ceil(fault.duration / fault.period - 1e-9)):
            begin = window * fault.period
            end = min(begin + fault.down, fault.duration)
            out += [FaultAction(index, "apply", step, start + begin, window),
                    FaultAction(index, "clear", step, start + end, window)]
        return out
    return [FaultAction(index, "apply", step, start), FaultAction(index, "clear", step, start + fault.duration)]


def schedule(faults: list[Fault] | tuple[Fault, ...]) -> list[FaultAction]:
    """Every action of every fault, in the order they fall due within each anchor."""
    return sorted((a for i, f in enumerate(faults) for a in actions_of(i, f)), key=FaultAction.sort_key)


def due(action: FaultAction, step_started: dict[int, float], first_step: float | None) -> float | None:
    """The clock time at which `action` falls due, given when rank 0 started each step so far and when the
    cell's first step started; None while its anchor has not happened yet."""
    if action.step is None:
        return None if first_step is None else first_step + action.offset_s
    started = step_started.get(action.step)
    return None if started is None else started + action.offset_s


def link_keys(fault: Fault) -> list[str]:
    """The two directions a link fault acts on."""
    assert fault.between is not None
    a, b = fault.between
    return [direction_key(a, b), direction_key(b, a)]


def impaired(params: LinkParams, fault: Fault) -> LinkParams:
    """One direction's parameters while `fault` is applied."""
    if fault.kind in ("partition", "flap"):
        return dataclasses.replace(params, loss=1.0)
    if fault.kind == "loss-burst":
        assert fault.loss is not None
        return dataclasses.replace(params, loss=fault.loss)
    if fault.kind == "latency":
        assert fault.latency is not None
        return dataclasses.replace(params, latency=fault.latency, jitter=fault.jitter or 0.0)
    if fault.kind == "bandwidth":
        return dataclasses.replace(params, bandwidth=fault.bandwidth)
    raise ValueError(f"{fault.kind} is not a link fault")


def longest_partition(faults: list[Fault] | tuple[Fault, ...]) -> float:
    """Seconds of the longest window in which a link drops every packet (0 without one): the process-group
    timeout must outlast it."""
    windows = [f.duration or 0.0 for f in faults if f.kind == "partition"]
    windows += [f.down or 0.0 for f in faults if f.kind == "flap"]
    return max(windows, default=0.0)

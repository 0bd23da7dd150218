"""The qdisc tree of one shaped link end, for either shaper, as plain data.

Two shapers give the same link semantics:
- ``netem``: root HTB (rate, burst sized for this kernel's HZ) -> one class -> a netem child carrying
  delay, jitter, loss, rate and a `limit` sized to the bandwidth-delay product.
- ``userspace-delay``: root HTB -> one class -> a pfifo of the same `limit`; delay, jitter and loss are
  left to the userspace delay line (testbed.agents.delayline), described by a `DelayLineSpec` (testbed.plan.delayline).

Jitter, in both: uniform in [latency - jitter, latency + jitter] (netem's law without a distribution
table), never below zero. Loss: independent per packet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from testbed.plan.delayline import DelayLineSpec
from testbed.spec.link import AUTO_QUEUE_MIN, MTU_FRAME, UNSHAPED_REFERENCE_RATE, LinkParams  # noqa: F401 (queue sizing lives with LinkParams)

Shaper = Literal["netem", "userspace-delay"]
SHAPERS: tuple[Shaper, ...] = ("netem", "userspace-delay")

NETEM_RATE_MAX = (2**32 - 1) * 8  # netem's TCA_NETEM_RATE is u32 bytes/s (pyroute2 has no RATE64)
HTB_BURST_SECONDS = 0.002  # burst = 2 ms of traffic: the default (rate/HZ) is too small at Gbit/s rates
HTB_BURST_MIN = 16 * 1024

ROOT = "root"


def tc_handle(major: int, minor: int = 0) -> int:
    """tc's 'major:minor' as the 32-bit integer netlink carries."""
    return (major << 16) | minor


def format_handle(handle: int | str) -> str:
    if handle == ROOT:
        return ROOT
    assert isinstance(handle, int)
    major, minor = handle >> 16, handle & 0xFFFF
    return f"{major:x}:" if minor == 0 else f"{major:x}:{minor:x}"


@dataclass(frozen=True)
class TcObject:
    """One `tc qdisc add` or `tc class add`: pyroute2 keyword options, handles as integers."""

    what: Literal["qdisc", "class"]
    kind: str
    handle: int
    parent: int | str
    options: dict[str, Any] = field(default_factory=dict, hash=False)

    def describe(self) -> str:
        opts = " ".join(f"{key} {value}" for key, value in self.options.items())
        return f"{self.what} {self.kind} {format_handle(self.handle)} parent {format_handle(self.parent)} {opts}"


@dataclass(frozen=True)
class Shaping:
    """Everything applied on one egress interface, and what no mechanism applies (reported, never hidden)."""

    shaper: Shaper
    params: LinkParams
    tc: tuple[TcObject, ...]
    delay_line: DelayLineSpec | None
    not_applied: tuple[str, ...]


def queue_limit(params: LinkParams) -> int:
    """Packets of queue: the configured number, or `auto` sized from the bandwidth-delay product
    (LinkParams.queue_packets, which the spec also bounds by this machine's memory)."""
    return params.queue_packets()


def htb_burst(rate_bps: float) -> int:
    """Bytes of HTB burst for a rate: 2 ms worth, at least 16 KiB."""
    return max(HTB_BURST_MIN, math.ceil(rate_bps / 8 * HTB_BURST_SECONDS))


def _htb(rate_bps: float) -> list[TcObject]:
    rate = int(rate_bps / 8)  # pyroute2 reads an integer rate as bytes per second
    burst = htb_burst(rate_bps)
    return [
        TcObject("qdisc", "htb", tc_handle(1), ROOT, {"default": 1}),
        TcObject("class", "htb", tc_handle(1, 1), tc_handle(1),
                 {"rate": rate, "ceil": rate, "burst": burst, "cburst": burst, "quantum": 60000}),
    ]


def netem_options(params: LinkParams, limit: int) -> dict[str, Any]:
    """pyroute2 netem options: delay/jitter in microseconds, loss in percent, rate in bytes/s."""
    options: dict[str, Any] = {
        "delay": round(params.latency * 1e6),
        "jitter": round(params.jitter * 1e6),
        "loss": params.loss * 100.0,
        "limit": limit,
    }
    options["rate"] = netem_rate(params)
    return options


def netem_rate(params: LinkParams) -> int:
    """netem's own rate in bytes/s, always given: a live `tc change` without one keeps the old rate.

    The link's bandwidth where it fits netem's u32 (34.36 Gbit/s; HTB above enforces it as well). With jitter
    and no such bandwidth, the u32 maximum: netem orders packets by their send time, so jitter without a rate
    reorders them; with a rate each packet leaves after the one ahead (FIFO, the delay line's semantics).
    0 (no rate) otherwise.
    """
    if params.bandwidth is not None and params.bandwidth <= NETEM_RATE_MAX:
        return int(params.bandwidth / 8)
    if params.jitter > 0:
        return NETEM_RATE_MAX // 8
    return 0


def plan_shaping(params: LinkParams, shaper: Shaper, delay_line: bool = True) -> Shaping:
    """The tc objects (and delay-line work) that give one link direction `params` under `shaper`.

    `delay_line=False` is for links the userspace delay line does not serve (intra-DC access links):
    their latency, jitter and loss are then reported in `not_applied`.
    """
    limit = queue_limit(params)
    has_rate = params.bandwidth is not None
    needs_delay = params.latency > 0 or params.jitter > 0 or params.loss > 0
    tc: list[TcObject] = _htb(params.bandwidth) if has_rate else []
    parent: int | str = tc_handle(1, 1) if has_rate else ROOT
    not_applied: list[str] = []
    line: DelayLineSpec | None = None
    if shaper == "netem":
        if needs_delay or has_rate:
            tc.append(TcObject("qdisc", "netem", tc_handle(0x10), parent, netem_options(params, limit)))
    elif shaper == "userspace-delay":
        if has_rate:
            tc.append(TcObject("qdisc", "pfifo", tc_handle(0x10), parent, {"limit": limit}))
        if delay_line:  # even at zero delay, so that a later live `shape` can add some
            line = DelayLineSpec(params.latency, params.jitter, params.loss, limit)
        elif needs_delay:
            not_applied += [name for name in ("latency", "jitter", "loss") if getattr(params, name) > 0]
    else:
        raise ValueError(f"unknown shaper {shaper!r} (known: {', '.join(SHAPERS)})")
    return Shaping(shaper, params, tuple(tc), line, tuple(not_applied))

"""The qdisc tree of one shaped link end, for either shaper, as plain data.

Two shapers give the same link semantics:
- ``netem``: root HTB (rate, burst sized for this kernel's HZ) -> one class -> a netem child carrying
  delay, jitter, loss, rate and a `limit` sized to the bandwidth-delay product; beside it a class of the same rate
  without netem, which a u32 filter gives only packets marked UNSHAPED_DSCP (`testbed probe`'s floor).
- ``userspace-delay``: root HTB -> one class -> a pfifo of the same `limit`; delay, jitter and loss are
  left to the userspace delay line (testbed.agents.delayline), described by a `DelayLineSpec` (testbed.plan.delayline).

Jitter, in both: uniform in [latency - jitter, latency + jitter] (netem's law without a distribution
table), never below zero. Loss: independent per packet.

One `Shaping` per link end, placed on its interface (`Placement`: a tree of its own, or a class under a root the
interface shares, as on a real host with one class per peer DC), and two renderers of its `tc` objects: netlink
requests (testbed.agents.tc.tc_request: what the netns backend and the docker routers send through pyroute2) and
tc argv (`tc_argv` here: what the ssh backend runs on a host). Both read the same objects and nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from testbed.plan.delayline import DSCP_BITS, UNSHAPED_DSCP, DelayLineSpec
from testbed.spec.link import AUTO_QUEUE_MIN, MTU_FRAME, UNSHAPED_REFERENCE_RATE, LinkParams  # noqa: F401 (queue sizing lives with LinkParams)

Shaper = Literal["netem", "userspace-delay"]
SHAPERS: tuple[Shaper, ...] = ("netem", "userspace-delay")

NETEM_RATE_MAX = (2**32 - 1) * 8  # netem's TCA_NETEM_RATE is u32 bytes/s (pyroute2 has no RATE64)
HTB_BURST_SECONDS = 0.002  # burst = 2 ms of traffic: the default (rate/HZ) is too small at Gbit/s rates
HTB_BURST_MIN = 16 * 1024

ROOT = "root"
UNSHAPED_MINOR = 0x3F  # the class beside a netem class that packets marked UNSHAPED_DSCP take (1:3f)


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
    """One `tc qdisc|class|filter add`: pyroute2 keyword options (rates in bytes/s, delays in microseconds, loss
    in percent), handles as integers. A u32 filter's options: prio, dst (a CIDR) or tos (a TOS byte whose DSCP
    bits must match) and flowid (a class handle)."""

    what: Literal["qdisc", "class", "filter"]
    kind: str
    handle: int
    parent: int | str
    options: dict[str, Any] = field(default_factory=dict, hash=False)

    def describe(self) -> str:
        opts = " ".join(f"{key} {value}" for key, value in self.options.items())
        return f"{self.what} {self.kind} {format_handle(self.handle)} parent {format_handle(self.parent)} {opts}"


@dataclass(frozen=True)
class Placement:
    """Where one link end's tree sits on its interface.

    Its own (`OWN_ROOT`, netns and docker): root htb `1:`, class `1:1`, leaf `10:`, and only what the
    parameters need (no rate: no htb; netem only with something to emulate). Shared (`shared_class`, ssh): the
    interface's root htb is not the link end's; the link end is the class `root:minor` (uncapped without a
    bandwidth), its leaf `minor:` (always, so a live change finds it) and a u32 filter per address in
    `matches` steering traffic into the class."""

    root: int = 0x10000
    minor: int = 1
    leaf: int = 0x100000
    shared: bool = False
    matches: tuple[str, ...] = ()  # CIDRs whose traffic the class carries (shared roots only)

    @property
    def classid(self) -> int:
        return self.root | self.minor


OWN_ROOT = Placement()


def shared_class(root_major: int, minor: int, matches: tuple[str, ...] = ()) -> Placement:
    """A class `root_major:minor` under the interface's own root htb, its leaf `minor:`."""
    return Placement(tc_handle(root_major), minor, tc_handle(minor), True, matches)


@dataclass(frozen=True)
class Shaping:
    """Everything applied on one egress interface, and what no mechanism applies (reported, never hidden)."""

    shaper: Shaper
    params: LinkParams
    tc: tuple[TcObject, ...]
    delay_line: DelayLineSpec | None
    not_applied: tuple[str, ...]
    # packets marked UNSHAPED_DSCP cross this end undelayed (the rate still applies): a delay line lets them
    # through, netem under an own root htb has a class of their own beside its class (UNSHAPED_MINOR); netem as
    # the root qdisc (no rate) or in a host's shared class delays them too
    marked_undelayed: bool = True

    def changed(self) -> tuple[TcObject, ...]:
        """What a live `tc change` of this tree touches: classes and leaf qdiscs (a root htb and filters keep
        their settings whatever the parameters)."""
        return tuple(o for o in self.tc if o.what == "class" or (o.what == "qdisc" and o.kind != "htb"))


def queue_limit(params: LinkParams) -> int:
    """Packets of queue: the configured number, or `auto` sized from the bandwidth-delay product
    (LinkParams.queue_packets, which the spec also bounds by this machine's memory)."""
    return params.queue_packets()


def htb_burst(rate_bps: float) -> int:
    """Bytes of HTB burst for a rate: 2 ms worth, at least 16 KiB."""
    return max(HTB_BURST_MIN, math.ceil(rate_bps / 8 * HTB_BURST_SECONDS))


UNCAPPED_RATE = 100e9  # bits/s of a shared root's class whose link has no bandwidth cap (it holds the leaf)


def _htb(rate_bps: float, placement: Placement = OWN_ROOT) -> list[TcObject]:
    rate = int(rate_bps / 8)  # pyroute2 reads an integer rate as bytes per second
    burst = htb_burst(rate_bps)
    root = [] if placement.shared else [TcObject("qdisc", "htb", placement.root, ROOT, {"default": placement.minor})]
    return [*root, TcObject("class", "htb", placement.classid, placement.root,
                            {"rate": rate, "ceil": rate, "burst": burst, "cburst": burst, "quantum": 60000})]


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


def plan_shaping(params: LinkParams, shaper: Shaper, delay_line: bool = True,
                 placement: Placement = OWN_ROOT) -> Shaping:
    """The tc objects (and delay-line work) that give one link direction `params` under `shaper`, placed on its
    interface as `placement` says.

    `delay_line=False` is for links the userspace delay line does not serve (intra-DC access links):
    their latency, jitter and loss are then reported in `not_applied`.
    """
    limit = queue_limit(params)
    has_rate = params.bandwidth is not None
    needs_delay = params.latency > 0 or params.jitter > 0 or params.loss > 0
    has_class = has_rate or placement.shared
    rate = params.bandwidth if params.bandwidth is not None else UNCAPPED_RATE
    tc: list[TcObject] = _htb(rate, placement) if has_class else []
    parent: int | str = placement.classid if has_class else ROOT
    not_applied: list[str] = []
    line: DelayLineSpec | None = None
    undelayed = True
    if shaper == "netem":
        if needs_delay or has_class:
            tc.append(TcObject("qdisc", "netem", placement.leaf, parent, netem_options(params, limit)))
            undelayed = has_class and not placement.shared
            if undelayed:  # marked packets (testbed probe's floor) take a class of their own: no netem
                tc += _unshaped_class(rate, placement)
    elif shaper == "userspace-delay":
        if has_class:
            tc.append(TcObject("qdisc", "pfifo", placement.leaf, parent, {"limit": limit}))
        if delay_line:  # even at zero delay, so that a later live `shape` can add some
            line = DelayLineSpec(params.latency, params.jitter, params.loss, limit)
        elif needs_delay:
            not_applied += [name for name in ("latency", "jitter", "loss") if getattr(params, name) > 0]
    else:
        raise ValueError(f"unknown shaper {shaper!r} (known: {', '.join(SHAPERS)})")
    tc += [TcObject("filter", "u32", 0, placement.root, {"prio": 1, "dst": cidr, "flowid": placement.classid})
           for cidr in placement.matches]
    return Shaping(shaper, params, tuple(tc), line, tuple(not_applied), undelayed)


def _unshaped_class(rate_bps: float, placement: Placement) -> list[TcObject]:
    """Beside a netem class under its own root: a class of the same rate, without netem, and a filter that steers
    packets marked UNSHAPED_DSCP into it."""
    *_, cls = _htb(rate_bps, Placement(placement.root, UNSHAPED_MINOR, placement.leaf))
    return [cls, TcObject("filter", "u32", 0, placement.root, {"prio": 1, "tos": UNSHAPED_DSCP << 2,
                                                                 "flowid": cls.handle})]


def tos_key(tos: int) -> tuple[int, int]:
    """A u32 key (value, mask) on the IPv4 header's first word that matches `tos`'s DSCP bits: the version nibble
    (4) is matched too, so that both renderers give the kernel the same key at offset 0 (pyroute2 starts a key
    at its first masked byte: DSCP alone would become a key at offset 1, `tc ... match ip tos` one at 0)."""
    return 0x40000000 | tos << 16, 0xF0000000 | DSCP_BITS << 16


def _bits(rate_bytes: int) -> str:
    return f"{rate_bytes * 8}bit"


def _options_argv(obj: TcObject) -> list[str]:
    """tc's words for an object's options (the same units netlink gets: tc converts them back)."""
    o = obj.options
    if (obj.what, obj.kind) == ("qdisc", "htb"):
        return ["default", f"{o['default']:x}"] if o.get("default") else []  # tc's own default is 0
    if (obj.what, obj.kind) == ("class", "htb"):
        return ["rate", _bits(o["rate"]), "ceil", _bits(o["ceil"]), "burst", str(o["burst"]), "cburst",
                str(o["cburst"]), "quantum", str(o["quantum"])]
    if (obj.what, obj.kind) == ("qdisc", "netem"):
        out = ["limit", str(o["limit"]), "delay", f"{o['delay']}us"]
        if o["jitter"]:
            out.append(f"{o['jitter']}us")
        if o["loss"]:
            out += ["loss", f"{o['loss']:.6g}%"]
        return [*out, "rate", _bits(o["rate"])]  # always: `tc change` without it keeps the old rate
    if (obj.what, obj.kind) == ("qdisc", "pfifo"):
        return ["limit", str(o["limit"])]
    if (obj.what, obj.kind) == ("filter", "u32") and "tos" in o:
        value, mask = tos_key(o["tos"])
        return ["match", "u32", f"0x{value:08x}", f"0x{mask:08x}", "at", "0", "flowid", format_handle(o["flowid"])]
    if (obj.what, obj.kind) == ("filter", "u32"):
        return ["match", "ip", "dst", o["dst"], "flowid", format_handle(o["flowid"])]
    raise ValueError(f"no tc words for a {obj.kind} {obj.what}")


def tc_argv(obj: TcObject, dev: str, verb: str = "add") -> list[str]:
    """The `tc` command line of one planned object on interface `dev` (verb add, change or del)."""
    where = ["root"] if obj.parent == ROOT else ["parent", format_handle(obj.parent)]
    if obj.what == "qdisc":
        head = ["tc", "qdisc", verb, "dev", dev, *where, "handle", format_handle(obj.handle)]
    elif obj.what == "class":
        head = ["tc", "class", verb, "dev", dev, *where, "classid", format_handle(obj.handle)]
    else:
        head = ["tc", "filter", verb, "dev", dev, *where, "protocol", "ip", "prio", str(obj.options["prio"])]
    return [*head, obj.kind, *_options_argv(obj)]


def shaping_argv(shaping: Shaping, dev: str, verb: str = "add") -> list[list[str]]:
    """The tc argv renderer: every object of a link end's tree as tc command lines, in order (`change`: only
    what a live change touches, Shaping.changed)."""
    return [tc_argv(obj, dev, verb) for obj in (shaping.tc if verb == "add" else shaping.changed())]

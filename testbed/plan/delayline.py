"""What a userspace delay line is told to do: the delay, jitter and loss of one link direction (DelayLineSpec,
part of a link end's Shaping) and each direction one delay line serves (DelayDirection, its config file).

Standard library only: the delay line loads its config into these classes and must start fast, also on an ssh
host that has nothing of testbed's dependencies."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

DELAY_LINE_QUEUE_MIN = 4096  # packets a delay-line queue holds at least (NFQUEUE's own default is 1024)
# Packets marked with this DSCP skip the delay line: `testbed probe` pings the same path with them, beside the
# shaped pings, for what the path takes unshaped (testbed.runner.fidelity). 63 is unassigned (RFC 2474's pool 2,
# experimental or local use) and nothing testbed runs marks its traffic.
UNSHAPED_DSCP = 63
DSCP_BITS = 0xFC  # a DSCP's six bits of the IP TOS byte (the other two are ECN's)


@dataclass(frozen=True)
class DelayLineSpec:
    """What the userspace delay line must do on one link direction."""

    latency: float
    jitter: float
    loss: float
    limit: int


def delay_line_queue(spec: DelayLineSpec) -> int:
    """The NFQUEUE length bound for one delayed direction."""
    return max(spec.limit, DELAY_LINE_QUEUE_MIN)


@dataclass(frozen=True)
class DelayDirection:
    """One direction a delay line serves: packets arriving on `ifname` (from `sources`, if given) go to
    NFQUEUE number `queue` and are held latency +- jitter, dropped with probability loss."""

    key: str  # direction key, e.g. "east->west"
    ifname: str
    queue: int
    latency: float
    jitter: float
    loss: float
    limit: int
    sources: tuple[str, ...] = ()
    comment: str = ""  # iptables comment on its rule, so an undo can find it

    @classmethod
    def serving(cls, key: str, ifname: str, queue: int, spec: DelayLineSpec, sources: tuple[str, ...] = (),
                comment: str = "") -> DelayDirection:
        """The delay line's work for direction `key` as `spec` plans it, on NFQUEUE number `queue`."""
        return cls(key, ifname, queue, spec.latency, spec.jitter, spec.loss, delay_line_queue(spec), sources, comment)

    def reshaped(self, spec: DelayLineSpec) -> DelayDirection:
        """The same direction with a live change's delay, jitter and loss (its queue stays bound as it is)."""
        return DelayDirection(self.key, self.ifname, self.queue, spec.latency, spec.jitter, spec.loss, self.limit,
                              self.sources, self.comment)

    def rule(self) -> list[str]:
        """The iptables arguments that send this direction's packets to its queue, all but those marked
        UNSHAPED_DSCP (no --queue-bypass: a dead delay line darkens the link rather than leave it silently
        undelayed)."""
        rule = ["-t", "mangle", "-A", "PREROUTING", "-i", self.ifname]
        if self.sources:
            rule += ["-s", ",".join(self.sources)]
        rule += ["-m", "dscp", "!", "--dscp", str(UNSHAPED_DSCP)]
        if self.comment:
            rule += ["-m", "comment", "--comment", self.comment]
        return [*rule, "-j", "NFQUEUE", "--queue-num", str(self.queue)]


def dump_config(work: list[DelayDirection] | tuple[DelayDirection, ...]) -> str:
    """A delay line's config file: the directions it serves, JSON."""
    return json.dumps([asdict(direction) for direction in work])


def load_config(text: str) -> list[DelayDirection]:
    """The directions a config file names (unknown keys are an error: the file and its reader must agree)."""
    names = {field.name for field in fields(DelayDirection)}
    work = []
    for item in json.loads(text):
        unknown = set(item) - names
        if unknown:
            raise ValueError(f"delay line config: unknown keys {', '.join(sorted(unknown))}")
        work.append(DelayDirection(**{**item, "sources": tuple(item.get("sources", ()))}))
    return work

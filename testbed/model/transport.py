"""How a transport moves bytes: the parameters of one (gloo over TCP as measured here, or an NCCL-like
transport for what-if at scale), TCP's window over a long round trip, and the time of a point-to-point
transfer on one connection.

gloo over TCP, as its source has it (gloo/allreduce.cc, gloo/transport/tcp/pair.cc): a ring all-reduce cuts
the buffer into segments of at most 1 MiB with two in flight per neighbour, and a payload leaves only after
the receiver's "recv ready" notification has arrived (a rendezvous: one extra one-way latency per segment
when the receiver posts late). Over a long round trip that makes it app-limited: two segments per round trip,
whatever the bandwidth. TCP (Linux): a connection starts with 10 segments of window, doubles it per round trip
while it fills it, and after an idle period longer than the retransmission timeout halves it per timeout
elapsed, down to the initial window (net.ipv4.tcp_slow_start_after_idle, on by default); it cuts what it sends
into units of about 1 ms of its pacing rate (tso_units). Those are the protocols' own constants; what depends on
the machine (per-operation software overhead, the rate of unshaped paths, the share of a shaped rate TCP payload
gets, the bytes on the wire beyond the units' headers) is fitted by testbed.model.calibration from measurements.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from testbed.plan.gso import KERNEL_DEFAULT

PAYLOAD_PER_FRAME = 1448 / 1514  # TCP payload per full Ethernet frame at MTU 1500 (timestamps on)
HEADER_BYTES = 14 + 20 + 32  # Ethernet, IPv4 and TCP (with timestamps) headers of one packet
PACING_SHIFT = 10  # a unit holds about 1/2^10 s of the pacing rate (sk_pacing_shift)
MIN_TSO_SEGS = 2  # net.ipv4.tcp_min_tso_segs


@dataclass(frozen=True)
class Transport:
    name: str = "gloo/tcp"
    kind: str = "gloo"  # gloo: segmented ring with rendezvous (simulated); nccl: closed-form ring/tree
    # protocol constants (gloo's source; Linux TCP defaults)
    segment_bytes: int = 1 << 20
    in_flight: int = 2
    rendezvous: bool = True
    mss: int = 1448
    initial_window: int = 10  # segments
    rto_min: float = 0.2  # seconds
    slow_start_after_idle: bool = True
    max_window: float = 128e6  # bytes (net.ipv4.tcp_wmem/rmem maximum the fabric sets, halved)
    gso_max: int = KERNEL_DEFAULT  # bytes: the largest unit TCP hands the stack (sk_gso_max_size: the testbed's interfaces'
    # size, testbed.plan.gso, which predict_cell sets from the topology)
    # fitted on this machine (defaults: a first guess, replaced by `testbed calibrate`)
    op_overhead: float = 3e-4  # seconds per collective or transfer call (Python, dispatch, wake-ups)
    message_overhead: float = 5e-5  # seconds per segment exchanged (copies, notifications)
    local_bandwidth: float = 8e9  # bits/s of an unshaped path (CPU-bound copies between namespaces)
    local_latency: float = 5e-5  # seconds one way on an unshaped path
    efficiency: float = PAYLOAD_PER_FRAME  # payload rate / configured rate of a shaped link
    late_receive: float = 0.0  # one-way latencies a receive posted after its send costs beyond the rendezvous
    # (fitted from the benchmark's late send/recv: measured here, not explained by gloo's protocol alone)
    restart_window: float = 1e12  # bytes: the window after an idle restart is at most this (fitted: measured cold
    # transfers restart lower than the halving rule alone gives: app-limited windows, HyStart, delayed ACKs)
    wire_overhead: float = 0.035  # kernel-counted bytes per payload byte, minus one, besides the headers of
    # the simulated sends' TSO units (ACKs, control: the calibration's residual)
    fixed_bytes: float = 0.0  # kernel-counted bytes per cell besides its steps (process-group start-up)

    def with_fit(self, **values: Any) -> Transport:
        return replace(self, **values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Transport:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class Connection:
    """One TCP connection's send side: its window, when it last sent (None: fresh), and until when its byte
    stream is busy (a payload queues behind the one before it on the same connection).

    Several operations can be in flight on one connection at once (ProcessGroupGloo's two worker threads run two
    collectives of one group on its one pair per peer): the simulator runs one operation after the other, so a
    later-simulated operation's payloads take the gaps its predecessor left on the byte stream (queued_behind)
    and share its window, rather than waiting for its end."""

    cwnd: float = 0.0
    last: float | None = None
    sent: float = 0.0  # payload bytes sent on shaped paths
    messages: int = 0  # sends on shaped paths
    units: int = 0  # the TSO units (packets on a virtual link) those sends were cut into: tso_units
    # (first, last byte leaves) of each payload, ordered by the first
    sending: list[tuple[float, float]] = field(default_factory=list)

    @property
    def busy_until(self) -> float:
        """When the last byte of every payload recorded so far has left."""
        return max((last for _, last in self.sending), default=0.0)

    def record(self, first: float, last: float) -> None:
        """A payload left from `first` to `last` (possibly before payloads simulated earlier)."""
        bisect.insort(self.sending, (first, last))
        self.last = last if self.last is None else max(self.last, last)

    def queued_behind(self, when: float) -> float:
        """When a message written at `when` leaves: after the last byte of a payload still leaving then, and of
        any that follows it back to back (one byte stream; a small message waits for the payload before it)."""
        index = max(0, bisect.bisect_right(self.sending, when, key=lambda span: span[0]) - 1)
        for first, last in self.sending[index:]:
            if first > when:
                break
            if when < last:
                when = last
        return when


@dataclass(frozen=True)
class Edge:
    """One direction between two ranks: one-way latency (s), payload rate (bytes/s), round trip (s)."""

    latency: float
    rate: float
    rtt: float
    shaped: bool = True


@dataclass
class Connections:
    """The TCP connections of a simulated run, by key (group, sender, receiver)."""

    transport: Transport
    table: dict[Any, Connection] = field(default_factory=dict)

    def get(self, key: Any) -> Connection:
        if key not in self.table:
            self.table[key] = Connection(cwnd=self.transport.initial_window * self.transport.mss)
        return self.table[key]


def restart_window(transport: Transport, conn: Connection, now: float, rtt: float) -> None:
    """Linux's tcp_cwnd_restart: after an idle period, halve the window per retransmission timeout elapsed."""
    if not transport.slow_start_after_idle or conn.last is None:
        return
    initial = transport.initial_window * transport.mss
    restart = min(initial, conn.cwnd)
    idle = now - conn.last
    rto = transport.rto_min + rtt
    if idle <= rto:
        return
    while idle > rto and conn.cwnd > restart:
        conn.cwnd /= 2
        idle -= rto
    conn.cwnd = max(min(conn.cwnd, transport.restart_window), restart)


def tso_units(transport: Transport, nbytes: float, window: float, rtt: float, slow_start: bool) -> int:
    """How many units Linux TCP cuts one round's `nbytes` into (tcp_tso_autosize): about 1 ms of the pacing rate
    it computes for itself (twice window / round trip in slow start, 1.2 times after), plus a bonus on round trips
    under 16 ms, at least two segments and at most the interfaces' GSO size. A virtual link (veth, the delay line's queue) passes
    them whole and its counters count them: long round trips and small windows make more, smaller packets, each
    with its headers."""
    rate = (2.0 if slow_start else 1.2) * window / max(rtt, 1e-9)
    size = rate / (1 << PACING_SHIFT)
    shift = int(rtt * 1e6) >> 9  # tcp_tso_rtt_log: the bonus halves per 512 us of minimum round trip
    if shift < 32:
        size += transport.gso_max >> shift
    mss = transport.mss
    size = max(MIN_TSO_SEGS, int(min(size, transport.gso_max) // mss)) * mss
    return max(1, math.ceil(nbytes / size))


def send_time(transport: Transport, conn: Connection, nbytes: float, edge: Edge, now: float) -> float:
    """Seconds from the first to the last byte of `nbytes` leaving on `conn` (arrival: add edge.latency).
    Slow start: each round sends a window and waits a round trip for its acknowledgements, the window growing
    by what they acknowledge (doubling while it is filled), until it covers the bandwidth-delay product. Linux
    grows it as long as at least half of it is in flight (tcp_is_cwnd_limited), so a send of half a window or
    more grows it by its size."""
    if nbytes <= 0:
        return 0.0
    if not edge.shaped:
        conn.record(now, now + nbytes / edge.rate)
        return nbytes / edge.rate
    restart_window(transport, conn, now, edge.rtt)
    bdp = edge.rate * edge.rtt
    left, elapsed, window, rounds = float(nbytes), 0.0, conn.cwnd, 0
    conn.sent += nbytes
    conn.messages += 1
    while left > 0:
        if window >= bdp:
            elapsed += left / edge.rate
            conn.units += tso_units(transport, left, max(window, bdp), edge.rtt, slow_start=False)
            break
        burst = min(window, left)
        left -= burst
        conn.units += tso_units(transport, burst, window, edge.rtt, slow_start=True)
        if left <= 0:
            elapsed += burst / edge.rate
            if 2 * burst >= window or rounds:  # after a filled round Linux still counts it limited (latched)
                window = min(window + burst, transport.max_window)
            break
        rounds += 1
        elapsed += max(edge.rtt, burst / edge.rate)
        window = min(2 * window, transport.max_window)
    conn.cwnd = window
    conn.record(now, now + elapsed)
    return elapsed

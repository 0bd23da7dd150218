"""Collectives and transfers over the emulated network: their time (gloo's segmented ring simulated rank by
rank, segment by segment; an NCCL-like closed form for what-if) and the bytes they put on every inter-DC
link direction (closed forms).

Ranks of a group are numbered as in torch.distributed: the group's ranks in ascending order, and gloo's ring
sends to the previous rank of the group (rank i -> i-1), so for ranks ordered DC by DC each DC boundary is
crossed by one ring edge in each direction.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass, field

from testbed.model.network import Network
from testbed.model.transport import HEADER_BYTES, Connections, Edge, Transport, restart_window, send_time


def ring_all_reduce_factor(g: int) -> float:
    """Bytes each rank sends in a ring all-reduce of N bytes over g ranks, over N: 2(g-1)/g."""
    return 2 * (g - 1) / g if g > 1 else 0.0


def hierarchical_link_ratio(n: int, dcs: int) -> float:
    """Bytes on the inter-DC links of a hierarchical all-reduce (reduce-scatter in each DC of n ranks, ring
    all-reduce of each shard across the D DCs) over those of a flat ring all-reduce of all D*n ranks:
    n(D-1)/(Dn-1). (Flat: 2(Dn-1)/(Dn) N on each crossing ring edge; hierarchical: n groups of D ranks each
    putting 2(D-1)/D of N/n on their crossing edge.)"""
    return n * (dcs - 1) / (dcs * n - 1)


def gloo_segments(total: int, g: int, element: int = 4, cap: int = 1 << 20) -> tuple[int, int]:
    """(segments, segment bytes) of gloo's ring all-reduce of `total` bytes over g ranks."""
    cap = element * max(1, cap // element)
    count = max(-(-total // cap), 2 * g)
    count = -(-count // g) * g
    size = -(-total // count)
    size = -(-size // element) * element
    return count, size


@dataclass
class Sim:
    """What a simulation runs on: the network, the transport, the connections' TCP state, the clock of each
    link direction (FIFO: a payload waits for the one before it on the same direction), and how many flows
    share each direction (their rate is divided)."""

    network: Network
    transport: Transport
    connections: Connections = None  # type: ignore[assignment]
    share: dict[str, int] = field(default_factory=dict)  # link direction key -> concurrent flows
    edges: dict[tuple[int, int, int], Edge] = field(default_factory=dict)  # edge()'s answers (network and
    # transport do not change during a simulation)

    def __post_init__(self) -> None:
        if self.connections is None:
            self.connections = Connections(self.transport)

    def wire_bytes(self) -> dict[str, tuple[float, float]]:
        """Per inter-DC link direction: (headers of the simulated sends' TSO units beyond each message's first,
        which MESSAGE_BYTES counts; payload bytes sent) over the connections crossing it."""
        out: dict[str, tuple[float, float]] = {}
        net = self.network
        for (_, src, dst), conn in self.connections.table.items():
            a, b = net.dc_of(src), net.dc_of(dst)
            if not conn.messages or a == b:
                continue
            for hop in net.path(a, b).hops:
                extra, sent = out.get(hop, (0.0, 0.0))
                out[hop] = (extra + HEADER_BYTES * (conn.units - conn.messages), sent + conn.sent)
        return out

    def wire_share(self) -> dict[str, float]:
        """wire_bytes as header bytes per payload byte, per link direction."""
        return {hop: extra / sent for hop, (extra, sent) in self.wire_bytes().items() if sent > 0}

    def edge(self, src: int, dst: int, flows: int = 1) -> Edge:
        """The path from rank src to rank dst; `flows` equal flows share its bandwidth."""
        key = (src, dst, flows)
        if key not in self.edges:
            self.edges[key] = self._edge(src, dst, flows)
        return self.edges[key]

    def _edge(self, src: int, dst: int, flows: int) -> Edge:
        t, net = self.transport, self.network
        a, b = net.dc_of(src), net.dc_of(dst)
        local_rate = t.local_bandwidth / 8
        if a == b:
            return Edge(t.local_latency, local_rate / flows, 2 * t.local_latency, shaped=False)
        path = net.path(a, b)
        rtt = net.rtt(a, b) + 2 * t.local_latency
        if path.bandwidth is None and path.latency == 0:
            return Edge(t.local_latency, local_rate / flows, rtt, shaped=False)
        rate = min(local_rate, path.bandwidth * t.efficiency / 8) if path.bandwidth else local_rate
        return Edge(path.latency + t.local_latency, rate / flows, rtt, shaped=True)


@functools.lru_cache(maxsize=4096)
def _segment_lengths(total: int, g: int, count: int, size: int, phase: str) -> tuple[tuple[int, ...], ...]:
    """lengths[i][r]: bytes rank r sends at iteration i of gloo's reduce-scatter or all-gather phase (cached:
    a simulation asks for the same few shapes thousands of times)."""
    per_rank = count // g
    span = count * size
    return tuple(tuple(max(0, min(size, total - ((((r + 1) if phase == "rs" else r) * per_rank + i) * size) % span))
                       for r in range(g)) for i in range(count - per_rank))


class LinkCalendar:
    """When each (sender, receiver) direction is busy carrying bytes, across the collectives that share it: a payload
    takes the first gap of its length from when it may leave, whichever collective was simulated first (they are
    simulated one after the other, their times overlap)."""

    def __init__(self) -> None:
        self.busy: dict[tuple[int, int], list[tuple[float, float]]] = {}

    def reserve(self, pair: tuple[int, int], earliest: float, seconds: float) -> float:
        """The start of the first free span of `seconds` at or after `earliest` on `pair`, now taken."""
        spans = self.busy.setdefault(pair, [])
        index = bisect.bisect_right(spans, (earliest, math.inf))
        begin = earliest
        if index > 0 and spans[index - 1][1] > begin:
            begin = spans[index - 1][1]
        while index < len(spans) and spans[index][0] < begin + seconds:
            begin = max(begin, spans[index][1])
            index += 1
        spans.insert(index, (begin, begin + seconds))
        return begin


def gloo_ring(sim: Sim, ranks: list[int], total: int, start: float, key: object, phases: tuple[str, ...] = ("rs", "ag"),
              flows: int = 1, link_free: LinkCalendar | None = None) -> float:
    """Simulate gloo's ring over `ranks` (all entering at `start`); returns when the last rank is done.
    Every segment: the receiver posts its receive (a notification crosses to the sender), the sender's
    payload leaves once both it and the notification are there and the direction is free, and arrives a
    one-way latency after its last byte; a rank starts iteration i once iteration i-2's receive and send
    are complete. `flows`: identical collectives running at once on other groups (they share the links).
    `link_free`: the directions' busy spans shared with the other collectives in flight (LinkCalendar): a payload
    also waits for a gap in them."""
    t = sim.transport
    g = len(ranks)
    if g < 2 or total <= 0:
        return start + t.op_overhead
    count, size = gloo_segments(total, g, cap=t.segment_bytes)
    edges = {(i, (i - 1) % g): sim.edge(ranks[i], ranks[(i - 1) % g], flows) for i in range(g)}
    back = {(i, (i + 1) % g): sim.edge(ranks[i], ranks[(i + 1) % g], flows) for i in range(g)}
    clock = start + t.op_overhead
    free = dict.fromkeys(edges, clock)
    for phase in phases:
        lengths = _segment_lengths(total, g, count, size, phase)
        steps = len(lengths)
        begin = [[clock] * g for _ in range(steps)]
        recv_done = [[clock] * g for _ in range(steps)]
        send_done = [[clock] * g for _ in range(steps)]
        window = t.in_flight
        for i in range(steps):
            if i >= window:
                for r in range(g):
                    begin[i][r] = max(recv_done[i - window][r], send_done[i - window][r]) + t.message_overhead
            for s in range(g):  # sender s -> receiver r = s - 1
                r = (s - 1) % g
                nbytes = lengths[i][s]
                if nbytes <= 0:
                    send_done[i][s] = begin[i][s]
                    continue
                edge = edges[(s, r)]
                ready = begin[i][r] + back[(r, s)].latency if t.rendezvous else begin[i][r]
                notify(sim, key, ranks[r], ranks[s], begin[i][r])
                conn = sim.connections.get((key, ranks[s], ranks[r]))
                leave = conn.queued_behind(max(begin[i][s], ready, free[(s, r)]))
                if link_free is not None:
                    leave = link_free.reserve((ranks[s], ranks[r]), leave, nbytes / edge.rate)
                duration = send_time(t, conn, nbytes, edge, leave)
                free[(s, r)] = leave + nbytes / edge.rate
                send_done[i][s] = leave
                recv_done[i][r] = max(recv_done[i][r], leave + duration + edge.latency)
            for r in range(g):
                if all(lengths[i][s] <= 0 for s in range(g) if (s - 1) % g == r):
                    recv_done[i][r] = begin[i][r]
        tail = range(max(0, steps - window), steps)
        clock = max([clock] + [max(recv_done[i][r], send_done[i][r]) for i in tail for r in range(g)])
    return clock


def gloo_all_reduce(sim: Sim, ranks: list[int], nbytes: int, start: float, key: object, flows: int = 1,
                    link_free: LinkCalendar | None = None) -> float:
    return gloo_ring(sim, ranks, nbytes, start, key, ("rs", "ag"), flows, link_free)


def gloo_reduce_scatter(sim: Sim, ranks: list[int], nbytes: int, start: float, key: object) -> float:
    """Reduce-scatter of `nbytes` (the whole input) over a group: the ring's first phase. The workload runs it on
    gloo as one all-to-all exchange and a local sum (testbed.workload.comm.reduce_scatter_into): the same (g-1)/g of
    the input leaves each rank, in one round instead of g-1; simulated as the ring still."""
    return gloo_ring(sim, ranks, nbytes, start, key, ("rs",))


def gloo_all_gather(sim: Sim, ranks: list[int], nbytes: int, start: float, key: object) -> float:
    """All-gather of shards of `nbytes` each: the ring's second phase over the gathered size."""
    return gloo_ring(sim, ranks, nbytes * len(ranks), start, key, ("ag",))


def notify(sim: Sim, key: object, src: int, dst: int, when: float) -> None:
    """A control message (gloo's "recv ready") sent from src to dst at `when`: TCP counts it as sending, so it
    restarts the window of an idle connection src -> dst as a payload would, and the connection is not idle
    after it."""
    conn = sim.connections.get((key, src, dst))
    if conn.last is not None and when > conn.last:
        restart_window(sim.transport, conn, when, sim.edge(src, dst).rtt)
    conn.last = when if conn.last is None else max(conn.last, when)


def transfer(sim: Sim, src: int, dst: int, nbytes: int, sent: float, posted: float, key: object,
             free: dict | None = None) -> tuple[float, float]:
    """A point-to-point send issued at `sent` into a receive posted at `posted`: (payload leaves, arrives).
    The receiver's "recv ready" goes on the pair's one connection (gloo's tcp Pair), behind any payload the
    receiver is sending the sender then (a pipeline's gradients going back while activations come forward).
    `free`: per-direction clocks (FIFO) shared by the caller's transfers."""
    t = sim.transport
    edge = sim.edge(src, dst)
    back = sim.edge(dst, src).latency
    notice = sim.connections.get((key, dst, src)).queued_behind(posted)
    ready = notice + back * (1 + (t.late_receive if posted > sent else 0.0)) if t.rendezvous else posted
    notify(sim, key, dst, src, notice)
    leave = max(sent + t.op_overhead, ready + t.message_overhead)
    if free is not None:
        leave = max(leave, free.get((src, dst), 0.0))
    conn = sim.connections.get((key, src, dst))
    leave = conn.queued_behind(leave)
    duration = send_time(t, conn, nbytes, edge, leave)
    if free is not None:
        free[(src, dst)] = leave + nbytes / edge.rate
    return leave, leave + duration + edge.latency


# --- bytes per inter-DC link direction (closed forms) --------------------------------------------------------

# Bytes on the wire per gloo message besides its payload: a 48-byte preamble and, once per message, a frame's
# Ethernet + IP + TCP headers (14 + 20 + 32); every payload goes with two notifications (send ready, recv ready)
# of their own. The headers of a payload's further units are the simulated sends' (Sim.wire_bytes); ACKs and
# other control are the calibration's proportional residual.
MESSAGE_BYTES = 3 * (48 + HEADER_BYTES)


def ring_link_bytes(network: Network, ranks: list[int], nbytes: float, factor: float) -> dict[str, float]:
    """Payload bytes a ring collective puts on each inter-DC link direction: every ring edge i -> i-1 carries
    factor * nbytes / g... summed over the edges that cross DCs (routed edges load every hop)."""
    g = len(ranks)
    out: dict[str, float] = {}
    if g < 2:
        return out
    per_edge = factor * nbytes
    for i in range(g):
        src, dst = ranks[i], ranks[(i - 1) % g]
        a, b = network.dc_of(src), network.dc_of(dst)
        if a != b:
            for hop in network.path(a, b).hops:
                out[hop] = out.get(hop, 0.0) + per_edge
    return out


def p2p_link_bytes(network: Network, src: int, dst: int, nbytes: float, messages: int = 1) -> dict[str, float]:
    """Bytes a point-to-point transfer puts on each inter-DC link direction it crosses (with `messages`
    messages' overhead; 0 for the payload alone)."""
    a, b = network.dc_of(src), network.dc_of(dst)
    return {} if a == b else dict.fromkeys(network.path(a, b).hops, nbytes + messages * MESSAGE_BYTES)


def gloo_broadcast_link_bytes(network: Network, ranks: list[int], root: int, nbytes: float) -> dict[str, float]:
    """Bytes gloo's broadcast (gloo/broadcast.cc: a binomial tree over the ranks renumbered from the root; in
    round i the 2^i ranks that hold the buffer each send all of it to their number + 2^i) puts on each inter-DC
    link direction: 4 ranks in 2 DCs of 2 from rank 0 cross twice, 0 -> 2 and 1 -> 3 (after 0 -> 1)."""
    g = len(ranks)
    out: dict[str, float] = {}
    for bit in range(max(0, g - 1).bit_length()):
        for virtual in range(min(1 << bit, g - (1 << bit))):
            src, dst = ranks[(virtual + root) % g], ranks[(virtual + (1 << bit) + root) % g]
            add_bytes(out, p2p_link_bytes(network, src, dst, nbytes))
    return out


def add_bytes(total: dict[str, float], more: dict[str, float], times: float = 1.0) -> dict[str, float]:
    for key, value in more.items():
        total[key] = total.get(key, 0.0) + value * times
    return total


# --- NCCL-like closed forms (what-if at scale) -------------------------------------------------------------

def ring_time(nbytes: float, g: int, latency: float, rate: float) -> float:
    """Alpha-beta ring all-reduce: 2(g-1) steps of latency, 2(g-1)/g of the buffer at `rate` bytes/s."""
    if g < 2:
        return 0.0
    return 2 * (g - 1) * latency + ring_all_reduce_factor(g) * nbytes / rate


def tree_time(nbytes: float, g: int, latency: float, rate: float) -> float:
    """Double binary tree all-reduce (NCCL's tree): 2 log2(g) latencies, the buffer at about the link rate."""
    if g < 2:
        return 0.0
    return 2 * math.ceil(math.log2(g)) * latency + nbytes / rate


def windowed_rate(rate: float, rtt: float, window: float, streams: int) -> float:
    """Throughput of `streams` TCP-like flows each limited to `window` bytes in flight: min(rate, k W / RTT)."""
    if rtt <= 0:
        return rate
    return min(rate, streams * window / rtt)

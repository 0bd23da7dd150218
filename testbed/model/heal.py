"""A torchft heal: how long a recovering replica group takes to fetch a healthy group's state, and its heal_s.

torchft 0.2.0's HTTP checkpoint transport (num_chunks 0, as testbed.workload.strategies.torchft sets it) fetches
the whole state with one GET over a fresh TCP connection: the handshake and the request (a round trip, then the
request's one-way trip), the healthy group serialising its state (torch's streaming save) while TCP carries it
through slow start at the path's payload rate (testbed.model.transport.send_time), the last byte's one-way trip,
and the recovering group reading it back. The copies run at the machine's unshaped rate (Transport.local_bandwidth,
fitted by `testbed calibrate`; its first guess otherwise). predict_heal puts the fetch in the whole heal: the
group's setup and own steps, the quorum the lighthouse grants it (its heartbeat and join timeouts, the survivors'
quorum period) and the rest of the step the heal ended in.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.model.transport import Connection, Edge, Transport, send_time


@dataclass(frozen=True)
class FetchPrediction:
    """The parts of a predicted fetch, seconds."""

    handshake_s: float  # connect and request: a round trip and a one-way trip
    transfer_s: float  # the state through TCP's window growth at the path's payload rate, and its last one-way trip
    copies_s: float  # serialising and reading it back at the machine's unshaped rate
    total_s: float


def predict_fetch(state_bytes: float, latency_there: float, latency_back: float, bandwidth: float | None,
                  transport: Transport) -> FetchPrediction:
    """`state_bytes` from the healthy group to the recovering one; `latency_there`: one way from the healthy group
    (the data's direction), `latency_back`: the other (seconds); `bandwidth`: the narrowest link's rate, bits/s
    (None: unshaped)."""
    rtt = latency_there + latency_back
    handshake = rtt + latency_back  # SYN and SYN-ACK, then the GET travels to the healthy group
    shaped = bandwidth is not None
    rate = (bandwidth * transport.efficiency if shaped else transport.local_bandwidth) / 8
    edge = Edge(latency=latency_there, rate=rate, rtt=rtt, shaped=shaped)
    conn = Connection(cwnd=transport.initial_window * transport.mss)
    transfer = send_time(transport, conn, state_bytes, edge, 0.0) + latency_there
    copies = 2 * state_bytes * 8 / transport.local_bandwidth
    return FetchPrediction(handshake, transfer, copies, handshake + transfer + copies)


@dataclass(frozen=True)
class HealPrediction:
    """The parts of a predicted heal_s (from the restarted group's start to the end of the step its heal ended in),
    seconds; the quorum's wait can fall anywhere from `wait_low_s` to `wait_high_s` (the survivors' phase in their
    quorum period is not known), `total_s` takes its middle."""

    setup_s: float  # its model, optimizer and Manager: the cell's measured figure (the model has no term for it)
    before_quorum_s: float  # its own steps before it first asks for a quorum
    quorum_wait_s: float  # until the lighthouse grants a quorum with a healthy group in it, and the answer's trip
    reconfigure_s: float  # the new quorum's process group built across the groups, before the fetch (measured)
    fetch_s: float  # predict_fetch's total
    rest_s: float  # the rest of the step the heal ended in
    wait_low_s: float
    wait_high_s: float
    survivors_waiting: bool  # it asked while the survivors still waited for the dead group's heartbeat to lapse
    total_s: float


def predict_heal(fetch: FetchPrediction, *, setup_s: float, before_quorum_s: float, quorum_period_s: float,
                 rest_s: float, reconfigure_s: float, asked_after_kill_s: float, heartbeat_timeout_s: float, join_timeout_s: float,
                 lighthouse_rtt_s: float) -> HealPrediction:
    """A restarted group's heal_s under torchft 0.2.0's lighthouse (its quorum_compute: a quorum holding every
    group of the previous one is granted at once; else one of at least min_replicas and more than half of the groups
    heartbeating, once all of those have joined or `join_timeout_s` after the first joined).

    The group asks after `setup_s` and `before_quorum_s` (its own steps first: none under torchft-ddp, a sync's
    inner steps less the fragment's delay under a DiLoCo), `asked_after_kill_s` after its DC was killed.
    - Before the dead group's heartbeat lapsed (`heartbeat_timeout_s`), the survivors are still in their first
      quorum since the kill (the previous one had the dead group, so none is granted at once): the new group completes
      it then, or `join_timeout_s` after they joined (taken as the kill: they ask within a step of it).
    - Later, the survivors have gone on in quorums of their own, the previous quorum is theirs, and the new group
      waits for their next ask: anywhere in their quorum period (`quorum_period_s`), its middle expected.
    Then the lighthouse's answer (`lighthouse_rtt_s`: the group's round trip to it), the new quorum's process group
    (`reconfigure_s`: gloo's rendezvous and connections across the groups, which torchft builds before the fetch; the
    cell's measured figure, as setup_s), the fetch and the step's rest."""
    waiting = asked_after_kill_s < heartbeat_timeout_s
    if waiting:
        low = high = max(0.0, join_timeout_s - asked_after_kill_s)
    else:
        low, high = 0.0, quorum_period_s
    wait = (low + high) / 2 + lighthouse_rtt_s
    total = setup_s + before_quorum_s + wait + reconfigure_s + fetch.total_s + rest_s
    return HealPrediction(setup_s, before_quorum_s, wait, reconfigure_s, fetch.total_s, rest_s, low + lighthouse_rtt_s,
                          high + lighthouse_rtt_s, waiting, total)

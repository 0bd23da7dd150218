"""A torchft heal's transfer: how long a recovering replica group takes to fetch a healthy group's state.

torchft 0.2.0's HTTP checkpoint transport (num_chunks 0, as testbed.workload.strategies.torchft sets it) fetches
the whole state with one GET over a fresh TCP connection: the handshake and the request (a round trip, then the
request's one-way trip), the healthy group serialising its state (torch's streaming save) while TCP carries it
through slow start at the path's payload rate (testbed.model.transport.send_time), the last byte's one-way trip,
and the recovering group reading it back. The copies run at the machine's unshaped rate (Transport.local_bandwidth,
fitted by `testbed calibrate`; its first guess otherwise). Not in this figure: the quorum that decides the heal (it
waits for the healthy groups' next quorum: a step under torchft-ddp, an outer step's fragment under DiLoCo) and the
step the recovered group then takes; heal_s measures those too.
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

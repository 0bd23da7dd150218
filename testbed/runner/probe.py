"""Measure every DC pair's RTT and TCP goodput with probe agents in the nodes; hold them against the plan.

Goodput is compared with what the configured rate can carry as TCP payload at MTU 1500: each 1514-byte
frame on the veth carries 1448 bytes of payload (TCP with timestamps), so 95.6 % of the shaped rate.
RTT is compared with what is *applied*: the configured latency of every link end on the round trip that
a running mechanism delays (netem, or a live userspace delay line); the rest is reported as not applied.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from testbed.agents import probe as agent
from testbed.fabric.base import Fabric
from testbed.fabric.errors import FabricError
from testbed.plan.network import LinkEnd, NetworkPlan, direction_key
from testbed.plan.routing import shortest_paths
from testbed.spec.topology import Topology

PAYLOAD_PER_FRAME = 1448 / 1514
PORT = 5201


@dataclass
class PairProbe:
    src: str
    dst: str
    shaper: str
    rtt_configured_ms: float
    rtt_applied_ms: float
    rtt_p50_ms: float | None
    rtt_p99_ms: float | None
    rtt_p50_error_ms: float | None
    pings: int
    ping_scheduling: str  # the pinger's: fifo, or other (a busy machine's wake-ups then count)
    ping_loss: float | None
    loss_configured: float
    rate_configured_mbps: float | None
    goodput_expected_mbps: float | None
    goodput_mbps: float | None
    goodput_error: float | None  # (measured - expected) / expected
    not_applied: str


def path_ends(plan: NetworkPlan, topology: Topology, src_dc: str, dst_dc: str) -> list[LinkEnd]:
    """The shaped egress ends a packet from node 0 of src_dc to node 0 of dst_dc leaves through."""
    dcs = shortest_paths(topology, src_dc)[dst_dc]
    keys = [f"{src_dc}-0:up"] + [direction_key(x, y) for x, y in itertools.pairwise(dcs)] + [f"{dst_dc}-0:down"]
    by_key = {end.key: end for end in plan.link_ends}
    return [by_key[key] for key in keys if key in by_key]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[rank]


def _agent(*args: str) -> list[str]:
    return [sys.executable, "-m", agent.__name__, *args]


class _Server:
    """A probe agent serving inside one node for the duration of a `with` block."""

    def __init__(self, fabric: Fabric, node: str) -> None:
        self.proc = fabric.popen(node, _agent("serve", "--port", str(PORT)), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)

    def __enter__(self) -> _Server:
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if "ready" not in line:
            self.proc.kill()
            raise FabricError(f"probe agent did not start: {self.proc.stderr.read().strip()[-300:]}")

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()


def _run_agent(fabric: Fabric, node: str, args: list[str], timeout: float) -> dict:
    proc = fabric.popen(node, _agent(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise FabricError(f"probe {args[0]} from {node} timed out after {timeout:.0f}s") from None
    if proc.returncode != 0:
        raise FabricError(f"probe {args[0]} from {node} failed: {err.strip().splitlines()[-1:]}")
    return json.loads(out)


def probe_pair(fabric: Fabric, plan: NetworkPlan, topology: Topology, src: str, dst: str, *,
               pings: int, seconds: float, applied: Callable[[LinkEnd], bool]) -> PairProbe:
    """RTT from src to dst and goodput src->dst (none with `seconds` 0), between node 0 of each DC, whose probe
    agent must be serving (_Server)."""
    there, back = path_ends(plan, topology, src, dst), path_ends(plan, topology, dst, src)
    round_trip = there + back
    configured = sum(end.shaping.params.latency for end in round_trip)
    applied_rtt = sum(end.shaping.params.latency for end in round_trip if applied(end))
    missing = sorted({f"{end.key}:{name}" for end in round_trip for name in ("latency", "jitter", "loss")
                      if getattr(end.shaping.params, name) > 0 and not applied(end)})
    keep = 1.0
    for end in round_trip:
        keep *= 1 - end.shaping.params.loss
    rates = [end.shaping.params.bandwidth for end in there if end.shaping.params.bandwidth is not None]
    rate = min(rates) if rates else None
    src_node, dst_node = plan.node(f"{src}-0"), plan.node(f"{dst}-0")
    measured = _run_agent(fabric, src_node.name, ["pair", dst_node.address, "--port", str(PORT), "--count",
                                                  str(pings), "--seconds", str(seconds)],
                          timeout=120 + pings * 0.05 + seconds)
    ping, flow = measured["rtt"], measured["flow"]
    rtts = ping["rtts"]
    p50 = statistics.median(rtts) * 1e3 if rtts else None
    expected = rate * PAYLOAD_PER_FRAME if rate is not None and flow is not None else None
    goodput = flow["goodput_bps"] if flow is not None else None
    return PairProbe(
        src=src, dst=dst, shaper=plan.shaper,
        rtt_configured_ms=configured * 1e3, rtt_applied_ms=applied_rtt * 1e3,
        rtt_p50_ms=p50, rtt_p99_ms=_percentile(rtts, 0.99) * 1e3 if rtts else None,
        rtt_p50_error_ms=(p50 - applied_rtt * 1e3) if p50 is not None else None,
        pings=ping["sent"], ping_scheduling=ping.get("scheduling", "other"),
        ping_loss=1 - ping["received"] / ping["sent"], loss_configured=1 - keep,
        rate_configured_mbps=rate / 1e6 if rate else None,
        goodput_expected_mbps=expected / 1e6 if expected else None,
        goodput_mbps=goodput / 1e6 if goodput is not None else None,
        goodput_error=(goodput - expected) / expected if expected and goodput is not None else None,
        not_applied=", ".join(missing),
    )


def probe_all(fabric: Fabric, plan: NetworkPlan, topology: Topology, *, pings: int = 200, seconds: float = 3.0,
              applied: Callable[[LinkEnd], bool],
              on_pair: Callable[[str, str], None] | None = None) -> list[PairProbe]:
    """Every ordered DC pair, one after the other: RTT, and goodput unless `seconds` is 0, in both directions.
    Node 0 of every DC serves the probes of all its pairs."""
    results = []
    dcs = [dc.name for dc in topology.dcs]
    with contextlib.ExitStack() as stack:
        servers = [stack.push(_Server(fabric, plan.node(f"{dc}-0").name)) for dc in dcs]  # all start at once
        for server in servers:
            server.wait_ready()
        for a, b in itertools.permutations(dcs, 2):
            if on_pair:
                on_pair(a, b)
            results.append(probe_pair(fabric, plan, topology, a, b, pings=pings, seconds=seconds, applied=applied))
            if seconds > 0:
                time.sleep(0.1)  # let the previous flow's queues drain
    return results


def as_records(results: list[PairProbe]) -> list[dict]:
    return [asdict(result) for result in results]

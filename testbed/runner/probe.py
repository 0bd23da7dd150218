"""Measure every DC pair's RTT and TCP goodput with probe agents in the nodes; hold them against the plan.

Goodput is compared with what the configured rate can carry as TCP payload at MTU 1500: each 1514-byte
frame on the veth carries 1448 bytes of payload (TCP with timestamps), so 95.6 % of the shaped rate.
RTT is compared with what is *applied* (the configured latency of every link end on the round trip that a running
mechanism delays: netem, or a live userspace delay line; the rest is reported as not applied) plus the pair's floor,
what the same path takes unshaped (pings marked to cross the shaping undelayed), or where a link end delays them too
its two DCs' own round trips, measured at the same time as the pair's pings, by pingers of their own
(testbed.runner.fidelity: the one definition, which bench/link_fidelity.py prints too); the DCs' own round trips are
reported beside either. Where a userspace delay line serves the round trip, its own figures come along: what it
still adds (residual) and the links whose delay is below what it can compensate.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

from testbed.agents import probe as agent
from testbed.agents.delayline.release import lateness_summary
from testbed.fabric.base import Fabric
from testbed.fabric.errors import FabricError
from testbed.plan.delayline import UNSHAPED_DSCP
from testbed.plan.network import LinkEnd, NetworkPlan, direction_key
from testbed.plan.routing import shortest_paths
from testbed.runner.fidelity import (
    PATH,
    below_compensation,
    held_floor,
    pair_floor_ms,
    path_floor_measurable,
    percentile,
    round_trip,
)
from testbed.runner.hostcpu import HOST_STEAL_BOUND, read_cpu_times, stolen_share
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
    rtt_floor_ms: float | None  # the unshaped round trip it is held against (testbed.runner.fidelity)
    rtt_floor_of: str  # what that floor is: "path" (the same path unshaped) or "dcs" (the two DCs' own)
    rtt_dc_floor_ms: float | None  # the two DCs' own round trips (their mean), measured at the same time
    rtt_expected_ms: float  # applied + floor
    rtt_p50_ms: float | None
    rtt_p99_ms: float | None
    rtt_p50_error_ms: float | None  # p50 - expected
    pings: int
    ping_scheduling: str  # the pinger's: fifo, or other (a busy machine's wake-ups then count)
    ping_loss: float | None
    loss_configured: float
    rate_configured_mbps: float | None
    goodput_expected_mbps: float | None
    goodput_mbps: float | None
    goodput_error: float | None  # (measured - expected) / expected
    not_applied: str
    flow_retransmits: int | None = None  # segments the flow's sender sent again (its TCP_INFO)
    flow_rwnd_limited: float | None = None  # share of the flow's busy time the receiver's window held it back
    flow_reader_gap_s: float | None = None  # the longest the sink went between two reads (a busy machine's)
    goodput_by_reads_mbps: float | None = None  # goodput counted by the sink's reads, as before 2026-11-28
    flow_sndbuf_limited: float | None = None  # share of the flow's busy time its own send buffer held it back
    flow_cwnd_packets: int | None = None  # the sender's congestion window at the end (packets)
    flow_min_rtt_ms: float | None = None  # the least round trip the sender's TCP saw during the flow
    delay_line_residual_ms: float | None = None  # what the delay lines on the round trip still add (their p50s)
    delay_line_note: str = ""  # links whose delay is below what the delay line can compensate
    rtt_p10_ms: float | None = None  # the 10th percentile: the path's delay with little of the hosts' scheduling
    # noise, which only ever adds (a stalled CPU holds some pings, never speeds one up)
    host_steal: float | None = None  # the share of this machine's CPU its hypervisor took during the pair's pings
    # (where they run on this machine: netns, docker); above HOST_STEAL_BOUND the RTT's error is partly theirs
    host_steal_note: str = ""  # says so, where it is above


def path_ends(plan: NetworkPlan, topology: Topology, src_dc: str, dst_dc: str) -> list[LinkEnd]:
    """The shaped egress ends a packet from node 0 of src_dc to node 0 of dst_dc leaves through."""
    dcs = shortest_paths(topology, src_dc)[dst_dc]
    keys = [f"{src_dc}-0:up"] + [direction_key(x, y) for x, y in itertools.pairwise(dcs)] + [f"{dst_dc}-0:down"]
    by_key = {end.key: end for end in plan.link_ends}
    return [by_key[key] for key in keys if key in by_key]


def _agent(*args: str) -> list[str]:
    return [sys.executable, "-m", agent.__name__, *args]


def _timing(fabric: Fabric) -> list[str]:
    """How the agents time arrivals on this fabric: by the kernel's receive time, unless a node's own kernel delays
    what it receives (Fabric.delays_on_nodes: its receive time predates the delay)."""
    return ["--user-time"] if fabric.delays_on_nodes else []


class _Server:
    """A probe agent serving inside one node for the duration of a `with` block."""

    def __init__(self, fabric: Fabric, node: str) -> None:
        self.proc = fabric.popen(node, _agent("serve", "--port", str(PORT), *_timing(fabric)), stdout=subprocess.PIPE,
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
    return _agent_answer(_start_agent(fabric, node, args), node, args, timeout)


def _start_agent(fabric: Fabric, node: str, args: list[str]) -> subprocess.Popen:
    return fabric.popen(node, _agent(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _agent_answer(proc: subprocess.Popen, node: str, args: list[str], timeout: float) -> dict:
    """What an agent started by _start_agent printed; a FabricError naming it where it failed or timed out."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise FabricError(f"probe {args[0]} from {node} timed out after {timeout:.0f}s") from None
    if proc.returncode != 0:
        raise FabricError(f"probe {args[0]} from {node} failed: {err.strip().splitlines()[-1:]}")
    return json.loads(out)


def floor_node(plan: NetworkPlan, topology: Topology, dc: str) -> tuple[str, str]:
    """Who measures DC `dc`'s own round trip: (pinger, target) = (node 1, node 0), or node 0 itself in a DC of
    one node. Node 0 serves the probes (_Server)."""
    nodes = next(spec.nodes for spec in topology.dcs if spec.name == dc)
    return plan.node(f"{dc}-{1 if nodes > 1 else 0}").name, plan.node(f"{dc}-0").address


@contextlib.contextmanager
def floors_beside(fabric: Fabric, plan: NetworkPlan, topology: Topology, dcs: tuple[str, ...], *, pings: int,
                  interval: float = 0.01, path: tuple[str, str] | None = None) -> Iterator[dict[str, float | None]]:
    """Each DC's own round trip while the `with` block measures something else: a pinger in each DC pings its node 0
    from the start of the block, for as long as the block's own `pings` take (testbed.runner.fidelity: a floor is
    measured at the same time as what it is held against); with `path` (pinger node, target address) also that
    path unshaped, pings marked UNSHAPED_DSCP, under the key PATH. When the block ends the dict holds each median
    (ms; None where every ping was lost)."""
    started = {}
    out: dict[str, float | None] = {}
    try:
        pingers = {dc: (*floor_node(plan, topology, dc), ()) for dc in dcs}
        if path is not None:
            pingers[PATH] = (*path, ("--dscp", str(UNSHAPED_DSCP)))
        for key, (pinger, target, marks) in pingers.items():
            args = ["rtt", target, "--port", str(PORT), "--count", str(pings), "--interval", str(interval),
                    *_timing(fabric), *marks]
            started[key] = (pinger, args, _start_agent(fabric, pinger, args))
        yield out
        for dc, (pinger, args, proc) in started.items():
            rtts = _agent_answer(proc, pinger, args, timeout=120 + pings * interval * 2)["rtts"]
            out[dc] = statistics.median(rtts) * 1e3 if rtts else None
    finally:
        for _, _, proc in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def delay_line_figures(fabric: Fabric) -> dict[str, dict]:
    """Direction key -> what its userspace delay line says of itself: residual (the p50 of how late packets went on
    their way against their due time), compensation, the least delay it can give (ms); {} where none runs."""
    out = {}
    for key, figures in fabric.delay_line_stats().items():
        summary = lateness_summary(figures.get("late", {}))
        out[key] = {"residual_ms": summary["p50_ms"], "packets": summary["packets"],
                    **{name: figures.get(name) for name in ("latency_ms", "compensation_ms", "least_ms")}}
    return out


def probe_pair(fabric: Fabric, plan: NetworkPlan, topology: Topology, src: str, dst: str, *,
               pings: int, seconds: float, applied: Callable[[LinkEnd], bool], here: bool = False) -> PairProbe:
    """RTT from src to dst and goodput src->dst (none with `seconds` 0), between node 0 of each DC, whose probe
    agent must be serving (_Server); held against applied + the floor (the same path unshaped, or the two DCs'
    own round trips: testbed.runner.fidelity) measured while the pair's pings run (floors_beside). `here`: the
    probes run on this machine, whose CPU time stolen meanwhile is kept (host_steal)."""
    there, back = path_ends(plan, topology, src, dst), path_ends(plan, topology, dst, src)
    ends = there + back
    configured = sum(end.shaping.params.latency for end in ends)
    applied_rtt = sum(end.shaping.params.latency for end in ends if applied(end))
    missing = sorted({f"{end.key}:{name}" for end in ends for name in ("latency", "jitter", "loss")
                      if getattr(end.shaping.params, name) > 0 and not applied(end)})
    keep = 1.0
    for end in ends:
        keep *= 1 - end.shaping.params.loss
    rates = [end.shaping.params.bandwidth for end in there if end.shaping.params.bandwidth is not None]
    rate = min(rates) if rates else None
    src_node, dst_node = plan.node(f"{src}-0"), plan.node(f"{dst}-0")
    path = (src_node.name, dst_node.address) if path_floor_measurable(ends) else None
    cpu_before = read_cpu_times() if here else None
    with floors_beside(fabric, plan, topology, (src, dst), pings=pings, path=path) as floors:
        measured = _run_agent(fabric, src_node.name, ["pair", dst_node.address, "--port", str(PORT), "--count",
                                                      str(pings), "--seconds", str(seconds), *_timing(fabric)],
                              timeout=120 + pings * 0.05 + seconds)
    stolen = stolen_share(cpu_before, read_cpu_times()) if here else None
    ping, flow = measured["rtt"], measured["flow"]
    dcs_floor = pair_floor_ms(floors[src], floors[dst])
    floor, floor_of = held_floor(floors.get(PATH), dcs_floor, applied_rtt * 1e3)
    rtts_ms = [value * 1e3 for value in ping["rtts"]]
    trip = round_trip(applied_rtt * 1e3, floor, rtts_ms)
    expected = rate * PAYLOAD_PER_FRAME if rate is not None and flow is not None else None
    goodput = flow["goodput_bps"] if flow is not None else None
    return PairProbe(
        src=src, dst=dst, shaper=plan.shaper,
        rtt_configured_ms=configured * 1e3, rtt_applied_ms=trip.applied_ms, rtt_floor_ms=trip.floor_ms,
        rtt_floor_of=floor_of, rtt_dc_floor_ms=dcs_floor,
        rtt_expected_ms=trip.expected_ms, rtt_p50_ms=trip.p50_ms, rtt_p99_ms=trip.p99_ms,
        rtt_p50_error_ms=trip.error_ms,
        pings=ping["sent"], ping_scheduling=ping.get("scheduling", "other"),
        ping_loss=1 - ping["received"] / ping["sent"], loss_configured=1 - keep,
        rate_configured_mbps=rate / 1e6 if rate else None,
        goodput_expected_mbps=expected / 1e6 if expected else None,
        goodput_mbps=goodput / 1e6 if goodput is not None else None,
        goodput_error=(goodput - expected) / expected if expected and goodput is not None else None,
        not_applied=", ".join(missing), rtt_p10_ms=percentile(rtts_ms, 0.10) if rtts_ms else None,
        host_steal=stolen, host_steal_note=steal_note(stolen), **_flow_counters(flow),
    )


def steal_note(stolen: float | None) -> str:
    """A pair's words where its hypervisor took more than HOST_STEAL_BOUND of the CPU during its pings."""
    if stolen is None or stolen <= HOST_STEAL_BOUND:
        return ""
    return (f"the hypervisor took {stolen:.1%} of this machine's CPU during these pings (above "
            f"{HOST_STEAL_BOUND:.0%}): the delay line's releases and the pings waited for its other guests")


def _flow_counters(flow: dict | None) -> dict:
    """The sender's TCP_INFO figures a PairProbe keeps (none without a flow or from an older agent/kernel): what
    held a flow back, where its goodput fell short (the receiver's window, its own buffer, the machine's reader)."""
    tcp = (flow or {}).get("tcp", {})
    busy = tcp.get("busy_us")
    by_reads = (flow or {}).get("read_goodput_bps")
    return {"flow_retransmits": tcp.get("total_retrans"),
            "flow_rwnd_limited": tcp["rwnd_limited_us"] / busy if busy and "rwnd_limited_us" in tcp else None,
            "flow_reader_gap_s": (flow or {}).get("reader_gap_max_s"),
            "goodput_by_reads_mbps": by_reads / 1e6 if by_reads is not None else None,
            "flow_sndbuf_limited": tcp["sndbuf_limited_us"] / busy if busy and "sndbuf_limited_us" in tcp else None,
            "flow_cwnd_packets": tcp.get("snd_cwnd"),
            "flow_min_rtt_ms": tcp["min_rtt_us"] / 1e3 if "min_rtt_us" in tcp else None}


def probe_all(fabric: Fabric, plan: NetworkPlan, topology: Topology, *, pings: int = 200, seconds: float = 3.0,
              applied: Callable[[LinkEnd], bool], on_pair: Callable[[str, str], None] | None = None,
              here: bool = False) -> list[PairProbe]:
    """Every ordered DC pair, one after the other: RTT (with the two DCs' own round trips at the same time), and
    goodput unless `seconds` is 0, in both directions. Node 0 of every DC serves the probes of all its pairs.
    `here`: the nodes are emulated on this machine (each pair keeps the CPU time stolen from it meanwhile)."""
    results = []
    dcs = [dc.name for dc in topology.dcs]
    with contextlib.ExitStack() as stack:
        servers = [stack.push(_Server(fabric, plan.node(f"{dc}-0").name)) for dc in dcs]  # all start at once
        for server in servers:
            server.wait_ready()
        for a, b in itertools.permutations(dcs, 2):
            if on_pair:
                on_pair(a, b)
            results.append(probe_pair(fabric, plan, topology, a, b, pings=pings, seconds=seconds, applied=applied,
                                      here=here))
            if seconds > 0:
                time.sleep(0.1)  # let the previous flow's queues drain
        lines = delay_line_figures(fabric)
    if lines:  # the delay lines' own figures, as they stand after every pair
        results = [_with_lines(result, plan, topology, lines) for result in results]
    return results


def _with_lines(result: PairProbe, plan: NetworkPlan, topology: Topology, lines: dict[str, dict]) -> PairProbe:
    ends = path_ends(plan, topology, result.src, result.dst) + path_ends(plan, topology, result.dst, result.src)
    served = [lines[end.key] | {"key": end.key} for end in ends if end.key in lines]
    residuals = [figures["residual_ms"] for figures in served if figures["residual_ms"] is not None]
    result.delay_line_residual_ms = sum(residuals) if residuals else None
    result.delay_line_note = "; ".join(note for figures in served if (note := below_compensation(figures["key"],
                                                                                                    figures)))
    return result


def as_records(results: list[PairProbe]) -> list[dict]:
    return [asdict(result) for result in results]

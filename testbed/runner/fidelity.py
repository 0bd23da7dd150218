"""What "a link's round trip is right" means, once, for `testbed probe` and bench/link_fidelity.py alike.

A DC pair's round trip is held against the round trip its links apply plus the floor, what the same path takes
unshaped: pings marked UNSHAPED_DSCP (testbed.plan.delayline) from the same node to the same node, with the same
pinger, which cross every link end undelayed: the delay lines let them through, and netem under its own root htb
gives them a class of its own without netem (testbed.plan.shaping). So the error is what the shaper adds beyond its
configured delay and nothing else: the gateways a packet crosses between DCs (0.01-0.03 ms a round trip here) are in
both. Where a link end delays marked packets too (netem as the root qdisc, on a link without a rate, or in an ssh
host's shared class) the floor is the mean of the two DCs' own round trips (node to node inside each DC; a pair's
round trip crosses each DC's access path once each way), which leaves the gateways in the error. Either floor is
measured at the same time as the pair's pings, by pingers of their own (testbed.runner.probe.floors_beside): what
the machine takes moves with its load (a vCPU that idles wakes up slower than a busy one), and a floor measured a
few seconds earlier missed that by up to 0.2 ms here (CHANGELOG, 2026-11-29). The error is the measured median less
that.

A round trip is timed as the network's: from the pinger's send to its kernel's receive time of the answer, less
how long the echo held the ping (TWAMP's turnaround, RFC 5357), so the pinger's and the echo's wake-ups are not in
it (testbed.agents.probe).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from testbed.agents.delayline.release import lateness_delta, lateness_summary
from testbed.fabric.lifecycle import Testbed
from testbed.plan.view import LinkEnd

DEFINITION = ("error = measured RTT median - (applied RTT + floor); floor = the same path's unshaped round trip "
              "(pings marked to cross the shaping undelayed, same nodes, same pinger, at the same time as the pair's "
              "pings), or where a link end delays them too, the mean of the two DCs' own round trips; a round trip "
              "is the network's (kernel receive time, less the echo's turnaround); pings randomly spaced around "
              "their interval")
PATH, DCS = "path", "dcs"  # what a floor is: the same path unshaped, or the two DCs' own round trips


@dataclass(frozen=True)
class RoundTrip:
    """One measured round trip against what it should be (ms)."""

    applied_ms: float  # the latency of every link end on the round trip that a running mechanism delays
    floor_ms: float | None  # the unshaped round trip it is held against (held_floor; None: not measured)
    expected_ms: float  # applied + floor
    p50_ms: float | None
    p99_ms: float | None
    error_ms: float | None  # p50 - expected


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile of `values`, by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def pair_floor_ms(src_floor_ms: float | None, dst_floor_ms: float | None) -> float | None:
    """A pair's unshaped round trip: the mean of its two DCs' own (one of them where only one was measured)."""
    known = [value for value in (src_floor_ms, dst_floor_ms) if value is not None]
    return statistics.fmean(known) if known else None


def path_floor_measurable(ends: list[LinkEnd]) -> bool:
    """Whether pings marked UNSHAPED_DSCP cross these link ends undelayed (Shaping.marked_undelayed): a delay line
    lets them through, netem under its own root gives them a class without netem; netem as the root qdisc (a link
    without a rate) or in a host's shared class delays them like every packet."""
    return all(end.shaping.marked_undelayed for end in ends)


def held_floor(path_ms: float | None, dcs_ms: float | None, applied_ms: float) -> tuple[float | None, str]:
    """The floor a pair is held against, and what it is: the same path's unshaped round trip where it was
    measured, else the two DCs' own. Also the DCs' own where the path's is more than half the applied round trip
    above them: the marked pings were delayed after all (a testbed brought up by an earlier version has no rule or
    class for them; a real network may strip the mark)."""
    delayed = path_ms is not None and dcs_ms is not None and applied_ms > 0 and path_ms - dcs_ms > applied_ms / 2
    return (path_ms, PATH) if path_ms is not None and not delayed else (dcs_ms, DCS)


def round_trip(applied_ms: float, floor_ms: float | None, rtts_ms: list[float]) -> RoundTrip:
    """A pair's measured round trips (ms) held against applied + floor."""
    expected = applied_ms + (floor_ms or 0.0)
    p50 = statistics.median(rtts_ms) if rtts_ms else None
    return RoundTrip(applied_ms, floor_ms, expected, p50, percentile(rtts_ms, 0.99) if rtts_ms else None,
                     p50 - expected if p50 is not None else None)


def below_compensation(key: str, figures: dict) -> str:
    """A note where a direction's delay is below what its delay line can give ("" where it is not)."""
    latency, least = figures.get("latency_ms"), figures.get("least_ms")
    if latency is None or least is None or latency <= 0 or latency >= least:
        return ""
    return f"{key}: {latency:.3f} ms is below the delay line's own {least:.3f} ms, not compensated"


LATE_FLAG_FRACTION, LATE_FLAG_FLOOR_MS = 0.05, 1.0  # the emulator itself is too late above max(5 % of delay, 1 ms)


def late_bound_ms(delay_ms: float) -> float:
    """p99 lateness of the delay line above which a cell's figures carry emulator error, not just endpoints'."""
    return max(LATE_FLAG_FRACTION * delay_ms, LATE_FLAG_FLOOR_MS)


def delay_line_cpu_s(before: dict, after: dict) -> float | None:
    """CPU seconds the delay lines' workers spent between two stats snapshots (direction key -> figures): one
    worker per gateway, which serves every direction arriving there (a->b is delayed in b's), counted once; a worker
    that replaced the one before counts from its start; a gateway with no figure before counts nothing (what it
    spent earlier is unknown). None where no worker says."""
    earlier = _workers(before)
    spent = []
    for gateway, now in _workers(after).items():
        then = earlier.get(gateway, [])
        worker, cpu = now[0]["worker"], max(f["worker_cpu_s"] for f in now)
        same = [f["worker_cpu_s"] for f in then if f["worker"] == worker]
        if same:
            spent.append(cpu - min(same))
        elif then:
            spent.append(cpu)  # restarted during the cell
    return sum(spent) if spent else None


def _workers(snapshot: dict) -> dict[str, list[dict]]:
    """A stats snapshot's figures that carry the worker's CPU, by gateway (the direction's receiving DC)."""
    out: dict[str, list[dict]] = {}
    for key, figures in snapshot.items():
        if figures.get("worker_cpu_s") is not None:
            out.setdefault(key.split("->")[-1], []).append(figures)
    return out


def delay_line_lateness(testbed: Testbed, before: dict, after: dict) -> dict[str, dict]:
    """Per delayed direction: how late the delay line released this cell's packets against their due times, and
    how its worker was scheduled (fifo, or other: where the machine refused real-time priority)."""
    out = {}
    for key, figures in sorted(after.items()):
        summary = lateness_summary(lateness_delta(before.get(key, {}), figures))
        delay_ms = testbed.plan.link_end(key).shaping.params.latency * 1e3
        out[key] = {**summary, "scheduling": figures.get("scheduling"), "delay_ms": delay_ms,
                    "bound_ms": late_bound_ms(delay_ms),
                    "late": summary["p99_ms"] is not None and summary["p99_ms"] > late_bound_ms(delay_ms),
                    # its own path, taken back (p50_ms above is the residual); a delay below least_ms is not
                    **{name: figures.get(name) for name in ("compensation_ms", "least_ms")},
                    "below_compensation": below_compensation(key, {**figures, "latency_ms": delay_ms})}
    return out

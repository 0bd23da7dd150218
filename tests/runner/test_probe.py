"""A pair's round trip is held against its two DCs' own round trips measured at the same time as its pings
(testbed.runner.fidelity): each DC's floor pinger is running when the pair's pinger starts, and the floor is the
mean of their medians. A floor measured seconds before the pair missed the machine's load by up to 0.2 ms
(CHANGELOG, 2026-11-29). No root: a stand-in fabric runs each agent as a process that prints its answer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testbed.plan.network import build_plan
from testbed.runner.probe import probe_pair
from tests.support.topologies import pair_topology

FLOOR_RTTS = {"east": [0.0001, 0.0002, 0.0009], "west": [0.0003, 0.0004, 0.0005]}  # seconds; medians 0.2, 0.4 ms
PAIR_RTTS = [0.0203, 0.0204, 0.0215]  # median 20.4 ms


class StandIn:
    """Runs each probe agent as a short process printing what the real one would; records who ran what and
    whether the floor pingers were still running when the pair's pinger started."""

    def __init__(self, topology, plan) -> None:
        self.dc_of = {plan.node(f"{dc.name}-{i}").name: dc.name for dc in topology.dcs for i in range(dc.nodes)}
        self.started: list[tuple[str, str]] = []  # (node, agent command)
        self.floors: list[subprocess.Popen] = []
        self.floors_running_at_pair: list[bool] = []

    def popen(self, node: str, argv: list[str], **kwargs) -> subprocess.Popen:
        command = argv[3]
        self.started.append((node, command))
        if command == "rtt":
            answer, delay = {"sent": 3, "received": 3, "rtts": FLOOR_RTTS[self.dc_of[node]]}, 1.0
        else:
            self.floors_running_at_pair = [proc.poll() is None for proc in self.floors]
            answer = {"rtt": {"sent": 3, "received": 3, "rtts": PAIR_RTTS, "scheduling": "fifo"}, "flow": None}
            delay = 0.0
        proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({delay}); print({json.dumps(answer)!r})"],
                                **kwargs)
        if command == "rtt":
            self.floors.append(proc)
        return proc


@pytest.mark.parametrize("east,pinger", [(2, "east-1"), (1, "east-0")])
def test_the_floor_is_measured_while_the_pairs_pings_run(east, pinger):
    topology = pair_topology(east=east, west=2, latency="10ms")
    plan = build_plan(topology, "userspace-delay")
    fabric = StandIn(topology, plan)
    result = probe_pair(fabric, plan, topology, "east", "west", pings=3, seconds=0, applied=lambda end: True)
    assert fabric.started == [(plan.node(name).name, command) for name, command in
                              ((pinger, "rtt"), ("west-1", "rtt"), ("east-0", "pair"))]
    assert fabric.floors_running_at_pair == [True, True]  # the floors were being measured when the pair began
    assert result.rtt_floor_ms == pytest.approx((0.2 + 0.4) / 2)
    assert result.rtt_applied_ms == pytest.approx(20.0)
    assert result.rtt_p50_error_ms == pytest.approx(20.4 - (20.0 + 0.3))

"""A pair's round trip is held against a floor measured at the same time as its pings (testbed.runner.fidelity):
the same path unshaped (pings marked UNSHAPED_DSCP, from the pair's own node to its target), where marked packets
cross every link end undelayed, else (netem as the root qdisc) the mean of its two DCs' own round trips, which are
measured beside either and reported.
Every floor pinger is running when the pair's pinger starts. A floor measured seconds before the pair missed the
machine's load by up to 0.2 ms (CHANGELOG, 2026-11-29). No root: a stand-in fabric runs each agent as a process
that prints its answer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testbed.plan.delayline import UNSHAPED_DSCP
from testbed.plan.network import build_plan
from testbed.runner.fidelity import held_floor, path_floor_measurable
from testbed.runner.probe import path_ends, probe_pair
from tests.support.topologies import pair_topology

FLOOR_RTTS = {"east": [0.0001, 0.0002, 0.0009], "west": [0.0003, 0.0004, 0.0005]}  # seconds; medians 0.2, 0.4 ms
PAIR_RTTS = [0.0203, 0.0204, 0.0215]  # median 20.4 ms
PATH_RTTS = [0.0005, 0.0006, 0.0001]  # the same path unshaped: median 0.5 ms


class StandIn:
    """Runs each probe agent as a short process printing what the real one would; records who ran what and
    whether the floor pingers were still running when the pair's pinger started."""

    delays_on_nodes = False  # as netns: the agents time arrivals by the kernel's receive time

    def __init__(self, topology, plan) -> None:
        self.dc_of = {plan.node(f"{dc.name}-{i}").name: dc.name for dc in topology.dcs for i in range(dc.nodes)}
        self.started: list[tuple[str, str]] = []  # (node, agent command)
        self.floors: list[subprocess.Popen] = []
        self.floors_running_at_pair: list[bool] = []
        self.argvs: list[list[str]] = []

    def popen(self, node: str, argv: list[str], **kwargs) -> subprocess.Popen:
        command = argv[3]
        self.started.append((node, command))
        self.argvs.append(argv)
        if command == "rtt":
            rtts = PATH_RTTS if argv[-2:] == ["--dscp", str(UNSHAPED_DSCP)] else FLOOR_RTTS[self.dc_of[node]]
            answer, delay = {"sent": 3, "received": 3, "rtts": rtts}, 1.0
        else:
            self.floors_running_at_pair = [proc.poll() is None for proc in self.floors]
            answer = {"rtt": {"sent": 3, "received": 3, "rtts": PAIR_RTTS, "scheduling": "fifo"}, "flow": None}
            delay = 0.0
        proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({delay}); print({json.dumps(answer)!r})"],
                                **kwargs)
        if command == "rtt":
            self.floors.append(proc)
        return proc


@pytest.mark.parametrize("shaper,east,floor_pingers,floor,floor_of", [
    ("userspace-delay", 2, (("east-1", "rtt"), ("west-1", "rtt"), ("east-0", "rtt")), 0.5, "path"),
    ("userspace-delay", 1, (("east-0", "rtt"), ("west-1", "rtt"), ("east-0", "rtt")), 0.5, "path"),
    ("netem", 2, (("east-1", "rtt"), ("west-1", "rtt")), 0.3, "dcs"),
])
def test_the_floor_is_measured_while_the_pairs_pings_run(shaper, east, floor_pingers, floor, floor_of):
    topology = pair_topology(east=east, west=2, latency="10ms")
    plan = build_plan(topology, shaper)
    fabric = StandIn(topology, plan)
    result = probe_pair(fabric, plan, topology, "east", "west", pings=3, seconds=0, applied=lambda end: True)
    assert fabric.started == [(plan.node(name).name, command) for name, command in
                              (*floor_pingers, ("east-0", "pair"))]
    assert fabric.floors_running_at_pair == [True] * len(floor_pingers)  # all measuring when the pair began
    assert (result.rtt_floor_ms, result.rtt_floor_of) == (pytest.approx(floor), floor_of)
    assert result.rtt_dc_floor_ms == pytest.approx((0.2 + 0.4) / 2)  # reported under either shaper
    assert result.rtt_applied_ms == pytest.approx(20.0)
    assert result.rtt_p50_error_ms == pytest.approx(20.4 - (20.0 + floor))


@pytest.mark.parametrize("on_nodes", [False, True])
def test_where_a_nodes_own_kernel_delays_what_it_receives_every_agent_times_in_user_space(on_nodes):
    """ssh and slurm run the delay line on the receiving node (Fabric.delays_on_nodes): a kernel receive time there
    predates the hold, so every pinger of the probe times arrivals in user space."""
    topology = pair_topology(east=2, west=2, latency="10ms")
    plan = build_plan(topology, "userspace-delay")
    fabric = StandIn(topology, plan)
    fabric.delays_on_nodes = on_nodes
    probe_pair(fabric, plan, topology, "east", "west", pings=3, seconds=0, applied=lambda end: True)
    assert len(fabric.argvs) == 4 and all(("--user-time" in argv) is on_nodes for argv in fabric.argvs)


@pytest.mark.parametrize("path,dcs,applied,held", [
    (0.05, 0.03, 20.0, (0.05, "path")),
    (None, 0.03, 20.0, (0.03, "dcs")),  # every marked ping lost
    (10.05, 0.03, 20.0, (0.03, "dcs")),  # delayed one way after all (a rule or class that is not there)
    (0.05, None, 20.0, (0.05, "path")),
    (0.05, 0.03, 0.0, (0.05, "path")),  # nothing applied: nothing to be delayed by
])
def test_a_path_floor_is_held_unless_the_marked_pings_were_delayed_after_all(path, dcs, applied, held):
    assert held_floor(path, dcs, applied) == held


@pytest.mark.parametrize("fields,shaper,measurable", [
    ({"latency": "10ms"}, "userspace-delay", True),
    ({"latency": "10ms", "bandwidth": "1gbit"}, "netem", True),  # netem under a root htb: a class beside it
    ({"latency": "10ms"}, "netem", False),  # netem is the root qdisc: it delays marked packets too
    ({"latency": "0ms"}, "netem", True),  # nothing delays
])
def test_the_same_path_unshaped_is_measurable_where_marked_packets_cross_undelayed(fields, shaper, measurable):
    topology = pair_topology(**fields)
    plan = build_plan(topology, shaper)
    ends = path_ends(plan, topology, "east", "west") + path_ends(plan, topology, "west", "east")
    assert path_floor_measurable(ends) is measurable

"""A fast link's units pass whole from sender to receiver: every interface of the path takes the plan's GSO size
(testbed.plan.gso), so the delay line handles one unit where it handled two or three. One interface left at
64 KiB would cut every unit into packets of the MTU there (1.4 kB each, about 100 times the delay line's work)."""

import platform
import struct

import pytest
from pyroute2 import NetNS

from testbed.agents.tc import interface_counters
from testbed.fabric.lifecycle import bring_up
from testbed.fabric.netns.gso import IFLA_GRO_IPV4_MAX_SIZE, IFLA_GSO_IPV4_MAX_SIZE, RTM_NEWLINK, request
from testbed.plan.gso import KERNEL_DEFAULT
from testbed.runner.probe import _run_agent, _Server
from tests.support.topologies import pair_topology

KERNEL_KNOWS = tuple(int(x) for x in platform.release().split(".")[:2]) >= (6, 3)  # IFLA_GSO_IPV4_MAX_SIZE


def test_the_request_names_the_interface_and_both_sizes():
    """nlmsghdr (16 bytes), ifinfomsg (16: family, type, index, flags, change), then two 32-bit attributes."""
    message = request(index=7, size=156_250, seq=3)
    length, kind, flags, seq, _ = struct.unpack_from("=IHHII", message)
    assert (length, kind, flags, seq) == (len(message), RTM_NEWLINK, 1 | 4, 3) and length == 48
    assert struct.unpack_from("=BxHiII", message, 16) == (0, 0, 7, 0, 0)
    assert struct.unpack_from("=HHIHHI", message, 32) == (8, IFLA_GSO_IPV4_MAX_SIZE, 156_250,
                                                           8, IFLA_GRO_IPV4_MAX_SIZE, 156_250)


def received(ns: str) -> tuple[int, int]:
    """(bytes, packets) node `ns`'s eth0 has received."""
    with NetNS(ns) as handle:
        counters = interface_counters(handle, "eth0")
    return counters.rx_bytes, counters.rx_packets


def bytes_per_unit(testbed) -> tuple[float, float]:
    """Payload bytes a 2 s flow east -> west carried per unit its delay line released, and bytes per packet
    west-0's eth0 received (everything after the delay line: the gateway's `lan`, the switch, the node)."""
    dst = testbed.plan.node("west-0")
    with _Server(testbed.fabric, dst.name):
        before, rx_before = testbed.fabric.delay_line_stats()["east->west"]["released"], received(dst.ns)
        flow = _run_agent(testbed.fabric, "east-0", ["send", dst.address, "--port", "5201", "--seconds", "2"],
                          timeout=60)
        after, rx_after = testbed.fabric.delay_line_stats()["east->west"]["released"], received(dst.ns)
    return flow["bytes"] / (after - before), (rx_after[0] - rx_before[0]) / (rx_after[1] - rx_before[1])


@pytest.mark.root
@pytest.mark.skipif(not KERNEL_KNOWS, reason="kernels before 6.3 have no IPv4 GSO size above 64 KiB")
@pytest.mark.parametrize("switch", ["1", "0"])
def test_units_of_a_fast_link_pass_whole(prefix, monkeypatch, switch):
    """At 2.5 Gbit/s the plan asks for 156 kB units; with TESTBED_GSO=0 the kernel's 64 KiB, which no unit can
    exceed. The first case fails if an interface before the delay line kept the kernel's size (the units it
    releases would be MTU-sized) or one after it (the receiver's packets would be)."""
    monkeypatch.setenv("TESTBED_GSO", switch)
    testbed = bring_up(pair_topology(latency="1ms", bandwidth="2.5gbit"), prefix=prefix, shaper="userspace-delay")
    assert testbed.plan.gso_max > KERNEL_DEFAULT
    released, arrived = bytes_per_unit(testbed)
    if switch == "1":
        assert KERNEL_DEFAULT < released <= testbed.plan.gso_max, released
        assert KERNEL_DEFAULT < arrived <= testbed.plan.gso_max + 200, arrived  # + the headers
    else:
        assert 0.5 * KERNEL_DEFAULT < released <= KERNEL_DEFAULT, released
        assert arrived <= KERNEL_DEFAULT + 200, arrived

"""The GSO size a netns testbed's interfaces get: what the fastest inter-DC link carries in half a millisecond,
never below the kernel's 64 KiB nor above what a veth takes (testbed.plan.gso), and the same in the plan."""

import pytest

from testbed.plan.gso import KERNEL_DEFAULT, KERNEL_MOST, gso_max_bytes
from testbed.plan.network import build_plan
from tests.support.topologies import link_data, make_topology, pair_topology


@pytest.mark.parametrize(("rates", "expected"), [
    ([], KERNEL_DEFAULT),  # one DC: no link
    (["100mbit"], KERNEL_DEFAULT),
    (["1gbit"], KERNEL_DEFAULT),  # 62 500 bytes in 0.5 ms: the kernel's own 64 KiB already
    (["2.5gbit"], 156_250),
    (["10gbit"], KERNEL_MOST),  # 625 000 bytes: more than a veth takes
    ([None], KERNEL_MOST),  # a link without a rate cap
    (["100mbit", "2.5gbit"], 156_250),  # the fastest link sets it for every interface
])
def test_a_unit_is_half_a_millisecond_of_the_fastest_link(rates, expected):
    dcs = {f"dc{i}": 1 for i in range(len(rates) + 1)}
    links = [link_data(f"dc{i}", f"dc{i + 1}", latency="1ms", **({"bandwidth": rate} if rate else {}))
             for i, rate in enumerate(rates)]
    assert gso_max_bytes(make_topology("t", dcs, links or None)) == expected


def test_a_link_faster_one_way_counts():
    topology = pair_topology(latency="1ms", bandwidth="100mbit", reverse={"bandwidth": "2.5gbit"})
    assert gso_max_bytes(topology) == 156_250


def test_the_plan_carries_it():
    assert build_plan(pair_topology(latency="1ms", bandwidth="2.5gbit"), "userspace-delay").gso_max == 156_250
    assert build_plan(pair_topology(latency="1ms", bandwidth="1gbit"), "netem").gso_max == KERNEL_DEFAULT

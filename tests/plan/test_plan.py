"""The plan is pure: addresses, routes and qdisc trees, checked without root."""

import ipaddress

import pytest

from testbed.plan.addressing import allocate
from testbed.plan.delayline import UNSHAPED_DSCP
from testbed.plan.network import build_plan, path_params
from testbed.plan.routing import next_hops, shortest_paths
from testbed.plan.shaping import (
    AUTO_QUEUE_MIN,
    MTU_FRAME,
    OWN_ROOT,
    format_handle,
    htb_burst,
    plan_shaping,
    queue_limit,
    shared_class,
    tos_key,
)
from testbed.spec import LinkParams, load_topology
from tests.conftest import TOPOLOGIES
from tests.support.topologies import link_data, make_topology


def topo(name):
    return load_topology(TOPOLOGIES / f"{name}.yaml")


def test_addresses_are_unique_inside_the_subnet():
    t = topo("chain-4dc-8")
    addressing = allocate(t)
    subnet = ipaddress.IPv4Network(t.subnet)
    seen = []
    for dc in addressing.dcs.values():
        assert dc.lan.subnet_of(subnet)
        seen += [dc.gateway, *dc.nodes]
        assert all(address in dc.lan for address in [dc.gateway, *dc.nodes])
    for link in addressing.links:
        seen += [link.a, link.b]
        assert link.network.prefixlen == 31
    assert len(seen) == len(set(seen)) == 4 * 9 + 3 * 2


def test_small_subnets_pack_tight_blocks():
    t = make_topology("x", {"a": 20, "b": 20}, [link_data("a", "b")], subnet="198.18.0.0/24")
    lans = [dc.lan for dc in allocate(t).dcs.values()]
    assert all(lan.prefixlen == 27 for lan in lans)


def test_chain_routes_go_hop_by_hop():
    t = topo("chain-4dc-8")
    hops = next_hops(t)
    assert hops["a"] == {"b": "b", "c": "b", "d": "b"}
    assert hops["c"] == {"a": "b", "b": "b", "d": "d"}
    assert shortest_paths(t, "a")["d"] == ["a", "b", "c", "d"]


def test_shortest_path_prefers_lower_latency():
    t = make_topology("x", {"a": 1, "b": 1, "c": 1}, [link_data("a", "c", latency="30ms"),
                                                      link_data("a", "b", latency="5ms"),
                                                      link_data("b", "c", latency="5ms")])
    assert shortest_paths(t, "a")["c"] == ["a", "b", "c"]
    assert shortest_paths(t, "c")["a"] == ["c", "b", "a"]  # symmetric


def test_plan_layout_for_two_dc():
    plan = build_plan(topo("two-dc"), "userspace-delay", prefix="tb-")
    names = {space.name for space in plan.namespaces}
    assert {"tb-east-0", "tb-east-1", "tb-east-sw", "tb-east-gw", "tb-west-gw"} <= names
    assert len(plan.namespaces) == 8
    assert [space.name for space in plan.namespaces if space.forwarding] == ["tb-east-gw", "tb-west-gw"]
    assert all(bridge.ns.endswith("-sw") for bridge in plan.bridges)  # never in the host namespace
    assert all(i.ns.startswith("tb-") for pair in plan.veths for i in (pair.a, pair.b))
    assert all(len(i.ifname) <= 15 for pair in plan.veths for i in (pair.a, pair.b))
    default = {r.ns: r.gateway for r in plan.routes if r.dst == "default"}
    assert default["tb-east-0"] == "198.18.0.1" and default["tb-west-1"] == "198.18.1.1"
    gateway_routes = {(r.ns, r.dst) for r in plan.routes if r.ns.endswith("-gw")}
    assert gateway_routes == {("tb-east-gw", "198.18.1.0/24"), ("tb-west-gw", "198.18.0.0/24")}
    assert plan.node("west-1").address == "198.18.1.3"


def test_prefix_is_configurable():
    plan = build_plan(topo("two-dc"), "netem", prefix="lab7-")
    assert all(space.name.startswith("lab7-") for space in plan.namespaces)


def test_netem_tree_is_htb_class_with_netem_child():
    """Beside the netem class, one of the same rate without netem that a filter gives packets marked UNSHAPED_DSCP
    (testbed probe's floor: the same path undelayed)."""
    params = LinkParams(latency=0.010, bandwidth=1e9, jitter=0.001, loss=0.001)
    shaping = plan_shaping(params, "netem")
    kinds = [(o.what, o.kind, format_handle(o.handle), format_handle(o.parent)) for o in shaping.tc]
    assert kinds == [("qdisc", "htb", "1:", "root"), ("class", "htb", "1:1", "1:"), ("qdisc", "netem", "10:", "1:1"),
                     ("class", "htb", "1:3f", "1:"), ("filter", "u32", "0:", "1:")]
    assert shaping.tc[3].options == shaping.tc[1].options  # the same rate
    assert shaping.tc[4].options == {"prio": 1, "tos": UNSHAPED_DSCP << 2, "flowid": shaping.tc[3].handle}
    assert shaping.marked_undelayed
    netem = shaping.tc[2].options
    assert netem["delay"] == 10000 and netem["jitter"] == 1000  # microseconds
    assert netem["loss"] == pytest.approx(0.1)  # percent
    assert netem["rate"] == 125_000_000  # bytes/s
    assert netem["limit"] == queue_limit(params)
    assert shaping.delay_line is None and shaping.not_applied == ()


@pytest.mark.parametrize("params,placement,undelayed", [
    (LinkParams(latency=0.010), OWN_ROOT, False),  # netem is the root qdisc: every packet passes through it
    (LinkParams(latency=0.010, bandwidth=1e9), shared_class(1, 0x10), False),  # a host's class: no class beside
    (LinkParams(), OWN_ROOT, True),  # nothing at all
])
def test_where_netem_has_no_class_beside_it_marked_packets_are_delayed_too(params, placement, undelayed):
    shaping = plan_shaping(params, "netem", placement=placement)
    assert shaping.marked_undelayed is undelayed
    assert not any(o.what == "filter" and "tos" in o.options for o in shaping.tc)


def test_userspace_tree_has_rate_in_kernel_and_delay_in_the_line():
    params = LinkParams(latency=0.020, bandwidth=1e9, loss=0.01)
    shaping = plan_shaping(params, "userspace-delay")
    assert [o.kind for o in shaping.tc] == ["htb", "htb", "pfifo"]
    assert shaping.tc[2].options["limit"] == queue_limit(params)
    assert shaping.delay_line.latency == 0.020 and shaping.delay_line.loss == 0.01


def test_access_links_without_netem_report_latency_as_not_applied():
    shaping = plan_shaping(LinkParams(latency=5e-6, bandwidth=1e10), "userspace-delay", delay_line=False)
    assert shaping.not_applied == ("latency",) and shaping.delay_line is None


def test_htb_burst_is_sized_for_the_rate():
    assert htb_burst(1e9) == 250_000  # 2 ms at 1 Gbit/s
    assert htb_burst(1e8) == 25_000
    assert htb_burst(1e6) == 16 * 1024
    cls = plan_shaping(LinkParams(bandwidth=1e9), "netem").tc[1]
    assert cls.options["burst"] == cls.options["cburst"] == 250_000


def test_auto_queue_is_sized_to_the_bandwidth_delay_product():
    long_fat = LinkParams(latency=0.050, bandwidth=10e9)
    assert queue_limit(long_fat) == pytest.approx(10e9 / 8 * 0.1 / MTU_FRAME, rel=0.001)  # ~82k packets
    assert queue_limit(LinkParams(latency=0.0001, bandwidth=1e8)) == AUTO_QUEUE_MIN
    assert queue_limit(LinkParams(latency=0.05, bandwidth=1e9, queue=777)) == 777


def test_asymmetric_directions_and_path_params():
    t = topo("asymmetric")
    plan = build_plan(t, "netem")
    assert plan.link_end("east->west").shaping.params.latency == pytest.approx(0.010)
    assert plan.link_end("west->east").shaping.params.bandwidth == pytest.approx(5e8)
    chain = topo("chain-4dc-8")
    assert [p.latency for p in path_params(build_plan(chain, "netem"), chain, "a", "d")] == [0.002] * 3


def test_overrides_change_one_direction():
    t = topo("two-dc")
    plan = build_plan(t, "netem", overrides={"east->west": LinkParams(latency=0.03, bandwidth=1e9)})
    assert plan.link_end("east->west").shaping.params.latency == 0.03
    assert plan.link_end("west->east").shaping.params.latency == 0.01


@pytest.mark.parametrize("first_word,matches", [
    (0x45FC0000, True),  # IPv4, DSCP 63, no ECN
    (0x45FF0000, True),  # the same with CE: the ECN bits are not the mark's
    (0x46FD1234, True),  # options (IHL 6), ECT(1), any length
    (0x45F80000, False),  # DSCP 62
    (0x45000000, False),  # unmarked
    (0x65FC0000, False),  # not IPv4
])
def test_the_marked_class_filter_matches_dscp_63_whatever_the_ecn_bits(first_word, matches):
    """The u32 key both renderers give the kernel (shaping.tos_key), on the IPv4 header's first word."""
    value, mask = tos_key(UNSHAPED_DSCP << 2)
    assert (value, mask) == (0x40FC0000, 0xF0FC0000)
    assert (first_word & mask == value) is matches

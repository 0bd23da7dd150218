"""Routed topologies on real hosts, root-free: every DC pair without a direct link is shaped end to end as the
netns backend routes it (testbed.plan.routing.compose, the one composition the model reads too), each direction
on its own, and a live change of a hop re-shapes every pair composed over it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from testbed.model.network import build_network
from testbed.plan.hosts import HopTotals, build_hosts_plan
from testbed.plan.routing import compose, route_hops
from testbed.spec import LinkParams, load_topology
from testbed.spec.errors import SpecError
from testbed.spec.inventory import HostSpec, Inventory
from tests.conftest import TOPOLOGIES
from tests.support.topologies import link_data, make_topology


def inventory_for(topology) -> Inventory:
    """One made-up host per node, its address from the DC's index."""
    return Inventory(dcs={dc.name: [HostSpec(name=f"{dc.name}{i}", address=f"10.9.{d}.{i + 1}", user="u", key="-",
                                             interface="eth0") for i in range(dc.nodes)]
                          for d, dc in enumerate(topology.dcs)})


def hosts_plan(topology, shaper="netem", overrides=None):
    return build_hosts_plan(topology, inventory_for(topology), shaper, "tb-", overrides)


CHAIN = load_topology(TOPOLOGIES / "chain-4dc-8.yaml")  # a - b - c - d, 2 ms and 1 Gbit/s each


def asymmetric_chain():
    """a - b - c, each direction its own latency, rate, jitter and loss."""
    return make_topology("asym-chain", {"a": 1, "b": 1, "c": 1}, [
        link_data("a", "b", latency="3ms", bandwidth="800mbit", jitter="1ms", loss="1%",
                  reverse={"latency": "5ms", "bandwidth": "200mbit", "jitter": "0ms", "loss": "0%"}),
        link_data("b", "c", latency="4ms", bandwidth="500mbit", jitter="2ms", loss="2%",
                  reverse={"latency": "1ms", "bandwidth": "900mbit", "jitter": "0.5ms", "loss": "0.5%"})])


def test_the_chain_shapes_every_pair_end_to_end_by_its_hops():
    plan = hosts_plan(CHAIN)
    kinds = {end.key: end.kind for end in plan.link_ends}
    assert len(kinds) == 12  # every ordered pair of four DCs has a class on its sending hosts
    assert {key for key, kind in kinds.items() if kind == "inter-dc"} == {"a->b", "b->a", "b->c", "c->b", "c->d",
                                                                         "d->c"}
    assert plan.composed()["a->d"] == ("a->b", "b->c", "c->d")
    assert plan.composed()["d->b"] == ("d->c", "c->b")
    hop = CHAIN.links[0].forward()
    for key, hops in plan.pair_hops.items():
        params = plan.link_end(key).shaping.params
        assert params.latency == pytest.approx(len(hops) * hop.latency)
        assert params.bandwidth == hop.bandwidth
        # the leaf's netem delay and its limit sized to the composed bandwidth-delay product
        netem = next(o for o in plan.link_end(key).shaping.tc if o.kind == "netem")
        assert netem.options["delay"] == round(len(hops) * hop.latency * 1e6)
        assert netem.options["limit"] == params.queue_packets()
    host = plan.host("a0")
    assert set(host.classes) == {"b", "c", "d"}  # one class per peer DC, routed or not


def test_an_asymmetric_route_composes_each_direction_on_its_own():
    topology = asymmetric_chain()
    plan = hosts_plan(topology)
    there, back = plan.link_end("a->c").shaping.params, plan.link_end("c->a").shaping.params
    assert there.latency == pytest.approx(7e-3) and back.latency == pytest.approx(6e-3)
    assert there.bandwidth == 500e6 and back.bandwidth == 200e6  # the narrowest hop's rate
    assert there.loss == pytest.approx(1 - 0.99 * 0.98) and back.loss == pytest.approx(1 - 0.995)
    assert there.jitter == pytest.approx(math.sqrt(1e-3 ** 2 + 2e-3 ** 2))  # independent hops: variances add
    assert back.jitter == pytest.approx(0.5e-3)
    assert there.queue is None  # auto: sized to the composed bandwidth-delay product
    assert there.queue_packets() == max(1000, math.ceil(500e6 / 8 * 2 * (7e-3 + there.jitter) / 1514))


def test_the_plan_and_the_model_compose_a_route_alike():
    topology = asymmetric_chain()
    plan = hosts_plan(topology)
    links = {f"{x}->{y}": plan.link_end(f"{x}->{y}").shaping.params for x, y in (("a", "b"), ("b", "a"), ("b", "c"),
                                                                                  ("c", "b"))}
    network = build_network(topology, links)
    for (a, b), path in network.paths.items():
        end = plan.link_end(f"{network.dcs[a]}->{network.dcs[b]}").shaping.params
        assert (path.latency, path.bandwidth, path.loss) == pytest.approx((end.latency, end.bandwidth, end.loss))
        assert path.hops == plan.pair_hops[f"{network.dcs[a]}->{network.dcs[b]}"]


def test_compose_of_one_hop_is_the_hop_and_a_given_queue_adds_up():
    hop = LinkParams(latency=2e-3, bandwidth=1e9, jitter=1e-4, loss=0.01, queue=300)
    assert compose([hop]) is hop
    two = compose([hop, replace(hop, queue=None)])
    assert two.queue == 300 + replace(hop, queue=None).queue_packets()
    with pytest.raises(ValueError):
        compose([])


def test_routes_are_the_netns_backends():
    assert route_hops(CHAIN, "d", "a") == (("d", "c"), ("c", "b"), ("b", "a"))
    ring = load_topology(TOPOLOGIES / "three-dc-ring.yaml")  # a tie: the direct link wins, as in netns
    assert hosts_plan(ring).composed() == {}


def test_a_live_change_of_a_hop_reshapes_every_pair_routed_over_it():
    plan = hosts_plan(CHAIN)
    changed = replace(CHAIN.links[1].forward(), latency=10e-3)  # b->c
    new = hosts_plan(CHAIN, overrides={"b->c": changed})
    assert sorted(new.crossing(["b->c"])) == ["a->c", "a->d", "b->c", "b->d"]
    assert new.link_end("a->d").shaping.params.latency == pytest.approx(14e-3)
    assert new.link_end("d->a").shaping.params == plan.link_end("d->a").shaping.params  # the other direction stays
    commands, reload = new.reshape_commands(new.host("a0"), ["b->c"])
    assert not reload  # netem: nothing to reload
    changes = [argv for argv in commands if argv[:3] == ["tc", "qdisc", "change"]]
    classes = {argv[argv.index("parent") + 1] for argv in changes}
    assert classes == {new.host("a0").classes["c"], new.host("a0").classes["d"]}  # a->c and a->d, not a->b
    assert {argv[argv.index("delay") + 1] for argv in changes} == {"12000us", "14000us"}
    assert new.reshape_commands(new.host("d0"), ["b->c"]) == ([], False)  # d sends nothing over b->c


def test_a_partition_of_a_hop_cuts_the_pairs_composed_over_it():
    cut = replace(CHAIN.links[0].forward(), loss=1.0)
    new = hosts_plan(CHAIN, overrides={"a->b": cut})
    assert new.link_end("a->d").shaping.params.loss == 1.0
    assert new.link_end("b->d").shaping.params.loss == 0.0


def test_the_receiving_hosts_delay_line_serves_a_composed_pair_and_reloads_on_a_hops_change():
    plan = hosts_plan(CHAIN, "userspace-delay")
    served = {line.key: line for line in plan.host("d0").delay_line}
    assert served["a->d"].latency == pytest.approx(6e-3)
    assert plan.reshape_commands(plan.host("d0"), ["a->b"])[1]  # a->d arrives at d over a->b
    assert not plan.reshape_commands(plan.host("b0"), ["c->d"])[1]


def test_a_composed_pairs_bytes_count_on_every_link_it_crosses():
    plan = hosts_plan(CHAIN)
    totals = HopTotals(plan)
    host = plan.host("a0")
    totals.add_qdiscs(host, [{"parent": host.classes["d"], "bytes": 1000, "packets": 2, "drops": 1},
                             {"parent": host.classes["b"], "bytes": 7, "packets": 1}])
    totals.add_received("a->d", 900, 3)
    counted = totals.counters()
    assert set(counted) == {end.key for end in plan.link_ends if end.kind == "inter-dc"}
    assert counted["a->b"] == (1007, 3, 900, 3, 1)
    assert counted["b->c"] == counted["c->d"] == (1000, 2, 900, 3, 1)
    assert counted["d->c"] == (0, 0, 0, 0, 0)


def test_a_direct_link_that_is_not_its_pairs_route_is_one_line():
    triangle = make_topology("tri", {"a": 1, "b": 1, "c": 1}, [
        link_data("a", "b", latency="1ms"), link_data("b", "c", latency="1ms"), link_data("a", "c", latency="9ms")])
    with pytest.raises(SpecError, match=r"links\[2\]: the link a - c is not the route from a to c \(a -> b -> c "
                                        "is shorter\\)"):
        hosts_plan(triangle)

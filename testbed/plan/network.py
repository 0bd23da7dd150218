"""The netns backend's plan, a TestbedView (testbed.plan.view): namespaces, veth pairs, bridges, addresses,
routes and shaped link ends of a topology.

Layout per DC (every namespace name carries the prefix, `tb-` by default):
  <dc>-<i>   one namespace per node, `eth0` with the node's address, default route via the DC gateway
  <dc>-sw    the DC switch: bridge `br0`, port `p<i>` per node and `up` towards the gateway. The bridge
             lives in a namespace of its own, never the host's (dockerd's FORWARD DROP eats bridged traffic)
  <dc>-gw    the DC gateway: `lan` on the DC subnet (.1), `to-<peer>` per inter-DC link, IP forwarding on,
             routes to every other DC over the shortest path of links
Veths are created from inside our namespaces with the peer placed straight into the other namespace, so the
host namespace never holds a testbed interface, not even for a moment.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from testbed.plan import DEFAULT_PREFIX
from testbed.plan.addressing import Addressing, allocate
from testbed.plan.delayline import DelayDirection
from testbed.plan.gso import KERNEL_DEFAULT, gso_max_bytes
from testbed.plan.routing import next_hops
from testbed.plan.shaping import Shaper, plan_shaping
from testbed.plan.sysctls import node_sysctls
from testbed.plan.view import InterDCLink, LinkEnd, Node, TestbedView
from testbed.spec.link import LinkParams
from testbed.spec.topology import Topology


@dataclass(frozen=True)
class Namespace:
    name: str
    role: str  # "node" | "switch" | "gateway"
    dc: str
    forwarding: bool = False


@dataclass(frozen=True)
class Interface:
    ns: str
    ifname: str
    address: str | None = None  # CIDR
    master: str | None = None  # bridge to enslave to


@dataclass(frozen=True)
class VethPair:
    a: Interface
    b: Interface


@dataclass(frozen=True)
class Route:
    ns: str
    dst: str  # CIDR or "default"
    gateway: str


@dataclass(frozen=True, kw_only=True)
class NetworkPlan(TestbedView):
    """The netns backend's plan: the view (nodes, link ends, links) and the kernel layout that makes it."""

    namespaces: tuple[Namespace, ...]
    bridges: tuple[Interface, ...]
    veths: tuple[VethPair, ...]
    routes: tuple[Route, ...]
    gateways: dict[str, str] = field(default_factory=dict)  # dc -> gateway namespace
    node_sysctls: dict[str, str] = field(default_factory=dict)  # what every non-router namespace gets (sysctls.py)
    gso_max: int = KERNEL_DEFAULT  # bytes: the largest unit every interface passes whole (gso.py)

    def delay_lines(self) -> dict[str, list[DelayDirection]]:
        """Gateway namespace -> the directions its userspace delay line serves: a->b is delayed where it
        arrives, in b's gateway, on packets coming in on `to-a` (empty under netem)."""
        out: dict[str, list[DelayDirection]] = {}
        for link in self.links:
            for key, src, dst in ((link.forward, link.a, link.b), (link.backward, link.b, link.a)):
                spec = self.link_end(key).shaping.delay_line
                if spec is not None:
                    work = out.setdefault(self.gateways[dst], [])
                    work.append(DelayDirection.serving(key, f"to-{src}", len(work), spec))
        return out

    def delay_line_of(self, key: str) -> str | None:
        """The gateway namespace whose delay line serves direction `key`, if any."""
        for ns, work in self.delay_lines().items():
            if any(item.key == key for item in work):
                return ns
        return None


def direction_key(src: str, dst: str) -> str:
    return f"{src}->{dst}"


def link_direction_params(topology: Topology, src: str, dst: str,
                          overrides: dict[str, LinkParams] | None = None) -> LinkParams:
    """The parameters of the src->dst direction of a direct link, after live `shape` overrides."""
    key = direction_key(src, dst)
    if overrides and key in overrides:
        return overrides[key]
    _, link, forward = topology.find_link(src, dst)
    return link.forward() if forward else link.backward()


def build_plan(topology: Topology, shaper: Shaper, prefix: str = DEFAULT_PREFIX,
               overrides: dict[str, LinkParams] | None = None) -> NetworkPlan:
    """Pure: the whole kernel layout of `topology`. `overrides` are per-direction link changes."""
    addressing: Addressing = allocate(topology)
    namespaces: list[Namespace] = []
    bridges: list[Interface] = []
    veths: list[VethPair] = []
    routes: list[Route] = []
    ends: list[LinkEnd] = []
    nodes: list[Node] = []
    gateways: dict[str, str] = {}

    for dc_index, dc in enumerate(topology.dcs):
        dc_addr = addressing.dcs[dc.name]
        plen = dc_addr.lan.prefixlen
        switch, gateway = f"{prefix}{dc.name}-sw", f"{prefix}{dc.name}-gw"
        gateways[dc.name] = gateway
        namespaces += [Namespace(switch, "switch", dc.name), Namespace(gateway, "gateway", dc.name, True)]
        bridges.append(Interface(switch, "br0"))
        veths.append(VethPair(Interface(gateway, "lan", f"{dc_addr.gateway}/{plen}"),
                              Interface(switch, "up", master="br0")))
        access = dc.intra.params()
        shaped_access = access.bandwidth is not None or access.latency > 0
        for index, node_name in enumerate(dc.node_names()):
            ns = f"{prefix}{node_name}"
            address = dc_addr.nodes[index]
            namespaces.append(Namespace(ns, "node", dc.name))
            nodes.append(Node(node_name, dc.name, dc_index, index, ns, str(address)))
            veths.append(VethPair(Interface(ns, "eth0", f"{address}/{plen}"),
                                  Interface(switch, f"p{index}", master="br0")))
            routes.append(Route(ns, "default", str(dc_addr.gateway)))
            if shaped_access:
                for key, end_ns, ifname in ((f"{node_name}:up", ns, "eth0"),
                                            (f"{node_name}:down", switch, f"p{index}")):
                    ends.append(LinkEnd(key, "access", end_ns, ifname,
                                        plan_shaping(access, shaper, delay_line=False)))

    links: list[InterDCLink] = []
    link_address: dict[tuple[str, str], str] = {}  # (dc, peer) -> address of peer's end of their link
    for index, link in enumerate(topology.links):
        a, b = link.between
        pair = addressing.links[index]
        ga, gb = gateways[a], gateways[b]
        veths.append(VethPair(Interface(ga, f"to-{b}", f"{pair.a}/31"), Interface(gb, f"to-{a}", f"{pair.b}/31")))
        link_address[(a, b)], link_address[(b, a)] = str(pair.b), str(pair.a)
        for src, dst, ns in ((a, b, ga), (b, a, gb)):
            params = link_direction_params(topology, src, dst, overrides)
            ends.append(LinkEnd(direction_key(src, dst), "inter-dc", ns, f"to-{dst}", plan_shaping(params, shaper)))
        links.append(InterDCLink(index, a, b, direction_key(a, b), direction_key(b, a), str(pair.a), str(pair.b)))

    for src, table in next_hops(topology).items():
        for dst, hop in sorted(table.items()):
            routes.append(Route(gateways[src], str(addressing.dcs[dst].lan), link_address[(src, hop)]))

    return NetworkPlan(topology=topology.name, prefix=prefix, shaper=shaper, nodes=tuple(nodes),
                       link_ends=tuple(ends), links=tuple(links), namespaces=tuple(namespaces),
                       bridges=tuple(bridges), veths=tuple(veths), routes=tuple(routes), gateways=gateways,
                       node_sysctls=node_sysctls(topology), gso_max=gso_max_bytes(topology))


def path_params(plan: TestbedView, topology: Topology, src_dc: str, dst_dc: str) -> list[LinkParams]:
    """The parameters of every inter-DC hop from src_dc to dst_dc, in order (as planned)."""
    from testbed.plan.routing import shortest_paths

    path = shortest_paths(topology, src_dc)[dst_dc]
    return [plan.link_end(direction_key(x, y)).shaping.params for x, y in itertools.pairwise(path)]

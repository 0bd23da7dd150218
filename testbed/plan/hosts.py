"""The ssh backend's plan, a TestbedView (testbed.plan.view): which host plays which node, and the tc/iptables
commands that shape its inter-DC traffic per peer DC, with the commands that undo them. Pure: argv lists, nothing
touches a host. Each link end is one Shaping placed as a class of the host's root (testbed.plan.shaping.Placement),
its commands rendered from it by testbed.plan.shaping.tc_argv.

On each host, on the interface the inventory names:
  root  htb 7e57:                      unclassified traffic (intra-DC, SSH) passes unshaped
  class 7e57:<10+k> per peer DC k      rate = the link's bandwidth, u32 filters on the peer DC's addresses
  leaf  netem (delay, jitter, loss, BDP limit) or, without netem, a pfifo of the same limit and the
        userspace delay line on the *receiving* host (iptables mangle PREROUTING -s peers -> NFQUEUE)
  iptables accounting rules count what arrives from each peer DC (the link's rx counters).
Every iptables rule carries the comment `testbed:<prefix>`, so undo finds them even after a crash.

A DC pair without a direct link (a chain a - b - c) is shaped end to end: the class for peer c on a's hosts
carries the route the netns backend takes (testbed.plan.routing), its hops composed by routing.compose (delays
summed, the narrowest rate, losses and jitters combined, each direction on its own). Its link end is kind
"routed", keyed a->c; `pair_hops` says which hops each pair crosses, so a live change of a hop re-shapes every pair
routed over it (HostsPlan.reshape_commands).

Semantics differ from the netns backend in one way, said in README and manifests: a DC link's bandwidth
is applied per host (each host's class), since hosts in a rack do not share one emulated WAN port; on a route,
the hops do not share their bandwidth between the pairs that cross them either.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from testbed.plan.delayline import DelayDirection
from testbed.plan.network import direction_key, link_direction_params
from testbed.plan.routing import compose, route_hops
from testbed.plan.shaping import (
    ROOT,
    UNCAPPED_RATE,  # noqa: F401 (where it was)
    Placement,
    Shaper,
    Shaping,
    TcObject,
    plan_shaping,
    shaping_argv,
    shared_class,
    tc_argv,
    tc_handle,
)
from testbed.plan.view import InterDCLink, LinkEnd, Node, TestbedView
from testbed.spec.errors import SpecError
from testbed.spec.inventory import HostSpec, Inventory
from testbed.spec.link import LinkParams
from testbed.spec.topology import Topology

ROOT_MAJOR = 0x7E57
ROOT_HANDLE = f"{ROOT_MAJOR:x}:"
# default 0: unclassified traffic (intra-DC, SSH) is sent unshaped (pyroute2 alone would default to class :10)
HOST_ROOT = TcObject("qdisc", "htb", tc_handle(ROOT_MAJOR), ROOT, {"default": 0})


def comment(prefix: str) -> str:
    return f"testbed:{prefix}"


@dataclass(frozen=True)
class HostPlan:
    """One host: the node it plays, and its shaping as commands (argv lists run with the host's sudo)."""

    node: Node
    host: HostSpec
    workdir: str
    apply: tuple[tuple[str, ...], ...]
    delay_line: tuple[DelayDirection, ...]
    classes: dict[str, str]  # peer DC -> classid on this host's interface


@dataclass(frozen=True, kw_only=True)
class HostsPlan(TestbedView):
    """The ssh backend's plan: the view (nodes are hosts; a link end is its class on every host of its source
    DC) and what each host runs."""

    hosts: tuple[HostPlan, ...]
    inventory_file: str | None = None
    pair_hops: dict[str, tuple[str, ...]] = field(default_factory=dict)  # pair key -> the hop keys it crosses

    def composed(self) -> dict[str, tuple[str, ...]]:
        """The pairs shaped end to end over more than one hop, and the hops each crosses."""
        return {pair: hops for pair, hops in self.pair_hops.items() if len(hops) > 1}

    def crossing(self, hops: Iterable[str]) -> list[str]:
        """The pairs (link-end keys) whose route crosses any of the direction keys `hops`."""
        wanted = set(hops)
        return [pair for pair, crossed in self.pair_hops.items() if wanted & set(crossed)]

    def reshape_commands(self, item: HostPlan, hops: Iterable[str]) -> tuple[list[list[str]], bool]:
        """What host `item` runs when the direction keys `hops` change live (this plan carrying the new
        parameters): `tc change` of every pair it sends whose route crosses them, and whether its delay line
        must reload (it receives one of those pairs)."""
        pairs = [pair.split("->") for pair in self.crossing(hops)]
        commands = [argv for src, dst in pairs if src == item.node.dc
                    for argv in class_commands(item.host.interface, item.classes[dst],
                                               self.link_end(direction_key(src, dst)).shaping.params, self.shaper,
                                               verb="change")]
        return commands, bool(item.delay_line) and any(dst == item.node.dc for _, dst in pairs)

    @property
    def network(self) -> HostsPlan:
        """The plan itself, as the view the runner, probe and reports read (what `.network` once held)."""
        return self

    def host(self, name: str) -> HostPlan:
        for item in self.hosts:
            if name in (item.node.name, item.host.name):
                return item
        raise KeyError(f"no node or host named {name!r} "
                       f"(nodes: {', '.join(f'{h.node.name} ({h.host.name})' for h in self.hosts)})")


def workdir(host: HostSpec, prefix: str) -> str:
    """Where everything testbed puts on the host lives (code, configs, logs, metrics); removed by undo."""
    return f"{host.workdir.rstrip('/')}/{prefix}{host.name}"


MEMORY_ROOT = "/dev/shm"  # a tmpfs on nearly every Linux host, writable by every user


def memory_dir(host: HostSpec, prefix: str) -> str:
    """Where the host's delay-line files go when MEMORY_ROOT is a tmpfs there (its workdir otherwise): a live
    re-shape rewrites its configuration and the worker its figures, and neither may wait on a busy disk."""
    return f"{MEMORY_ROOT}/{prefix}{host.name}"


def match_inventory(topology: Topology, inventory: Inventory, source: str | None = None) -> list[tuple[Node, HostSpec]]:
    """Hosts in topology order: DC by DC, node i of a DC played by the DC's i-th inventory host."""
    names = [dc.name for dc in topology.dcs]
    for dc in inventory.dcs:
        if dc not in names:
            raise SpecError(source, f"dcs.{dc}", f"topology {topology.name} has no DC {dc!r} (DCs: {', '.join(names)})")
    out: list[tuple[Node, HostSpec]] = []
    for dc_index, dc in enumerate(topology.dcs):
        hosts = inventory.dcs.get(dc.name)
        if hosts is None:
            raise SpecError(source, "dcs", f"no hosts for DC {dc.name!r} of topology {topology.name}")
        if len(hosts) != dc.nodes:
            raise SpecError(source, f"dcs.{dc.name}", f"{len(hosts)} host(s) listed, topology {topology.name} has "
                            f"{dc.nodes} node(s) in {dc.name}")
        for index, (name, host) in enumerate(zip(dc.node_names(), hosts)):
            out.append((Node(name, dc.name, dc_index, index, host.name, host.address), host))
    addresses = [host.address for _, host in out]
    if len(set(addresses)) != len(addresses):
        raise SpecError(source, "dcs", "two hosts share an address; every node needs its own")
    return out


def pair_routes(topology: Topology) -> dict[str, tuple[str, ...]]:
    """Every ordered DC pair's key -> the direction keys of the links its route crosses (the netns backend's
    routes). A direct link that is not its own DC pair's route is refused in one line: on a host, the pair's one
    class cannot carry both."""
    names = [dc.name for dc in topology.dcs]
    routes: dict[str, tuple[str, ...]] = {}
    for src in names:
        for dst in names:
            if src != dst:
                routes[direction_key(src, dst)] = tuple(direction_key(x, y) for x, y in route_hops(topology, src, dst))
    for index, link in enumerate(topology.links):
        a, b = link.between
        for src, dst in ((a, b), (b, a)):
            if routes[direction_key(src, dst)] != (direction_key(src, dst),):
                via = " -> ".join([src, *(hop.split("->")[1] for hop in routes[direction_key(src, dst)])])
                raise SpecError(topology.name, f"links[{index}]", f"the link {a} - {b} is not the route from {src} "
                                f"to {dst} ({via} is shorter): on real hosts each DC pair is shaped as its one route; "
                                "remove the link or make it the shorter way")
    return routes


def peer_placement(dc_index: int, matches: tuple[str, ...] = ()) -> Placement:
    """Where the link end towards the DC at `dc_index` sits on a host's interface: class 7e57:<10+k>."""
    return shared_class(ROOT_MAJOR, 0x10 + dc_index, matches)


def class_commands(dev: str, classid: str, params: LinkParams, shaper: Shaper, verb: str = "add") -> list[list[str]]:
    """The HTB class and its leaf for one peer DC, as tc argv rendered from their Shaping; verb 'change'
    re-shapes in place (flows keep their queue)."""
    major, minor = (int(part, 16) for part in classid.split(":"))
    return shaping_argv(plan_shaping(params, shaper, placement=shared_class(major, minor)), dev, verb)


def accounting_rule(dev: str, sources: tuple[str, ...], peer: str, prefix: str) -> list[str]:
    """An iptables rule with no target: its counters are the bytes that arrived from DC `peer`."""
    return ["iptables", "-w", "-t", "mangle", "-A", "PREROUTING", "-i", dev, "-s", ",".join(sources), "-m", "comment",
            "--comment", f"{comment(prefix)}:rx:{peer}"]


def build_hosts_plan(topology: Topology, inventory: Inventory, shaper: Shaper, prefix: str,
                     overrides: dict[str, LinkParams] | None = None, inventory_file: str | None = None) -> HostsPlan:
    """Pure: every host's node, shaping commands and delay-line work for `topology` under `shaper`."""
    routes = pair_routes(topology)
    pairs = match_inventory(topology, inventory, inventory_file)
    nodes = tuple(node for node, _ in pairs)
    by_dc: dict[str, list[tuple[Node, HostSpec]]] = {}
    for node, host in pairs:
        by_dc.setdefault(node.dc, []).append((node, host))
    dc_names = [dc.name for dc in topology.dcs]
    addresses = {dc: tuple(host.address for _, host in by_dc[dc]) for dc in dc_names}
    classid = {dc: f"{ROOT_MAJOR:x}:{0x10 + index:x}" for index, dc in enumerate(dc_names)}

    ends: list[LinkEnd] = []
    links: list[InterDCLink] = []
    shaping: dict[tuple[str, str], Shaping] = {}

    def shape_pair(src: str, dst: str) -> LinkEnd:
        """The class for peer `dst` on `src`'s hosts: its route's hops composed (one hop: the link itself)."""
        hops = [tuple(hop.split("->")) for hop in routes[direction_key(src, dst)]]
        params = compose([link_direction_params(topology, x, y, overrides) for x, y in hops])
        placement = peer_placement(dc_names.index(dst), tuple(f"{address}/32" for address in addresses[dst]))
        shaping[(src, dst)] = plan_shaping(params, shaper, placement=placement)
        return LinkEnd(direction_key(src, dst), "inter-dc" if len(hops) == 1 else "routed",
                       ",".join(h.name for _, h in by_dc[src]), f"class {classid[dst]}", shaping[(src, dst)])

    for index, link in enumerate(topology.links):
        a, b = link.between
        ends += [shape_pair(a, b), shape_pair(b, a)]
        links.append(InterDCLink(index, a, b, direction_key(a, b), direction_key(b, a), addresses[a][0],
                                 addresses[b][0]))
    ends += [shape_pair(*pair.split("->")) for pair, hops in routes.items() if len(hops) > 1]

    plans: list[HostPlan] = []
    for node, host in pairs:
        dev = host.interface
        apply: list[list[str]] = [tc_argv(HOST_ROOT, dev)]
        delay: list[DelayDirection] = []
        peers = [dc for dc in dc_names if dc != node.dc]
        for peer in peers:
            apply += shaping_argv(shaping[(node.dc, peer)], dev)  # class, leaf, a u32 filter per peer address
            apply.append(accounting_rule(dev, addresses[peer], peer, prefix))
            incoming = shaping[(peer, node.dc)].delay_line  # None under netem: the leaf delays
            if incoming is not None:
                delay.append(DelayDirection.serving(direction_key(peer, node.dc), dev, len(delay), incoming,
                                                    addresses[peer], comment(prefix)))
        plans.append(HostPlan(node, host, workdir(host, prefix), tuple(tuple(c) for c in apply), tuple(delay),
                              {peer: classid[peer] for peer in peers}))

    return HostsPlan(topology=topology.name, prefix=prefix, shaper=shaper, nodes=nodes, link_ends=tuple(ends),
                     links=tuple(links), hosts=tuple(plans), inventory_file=inventory_file, pair_hops=routes)


class HopTotals:
    """Counters per inter-DC direction, summed from what each host counts per peer DC (its class's leaf, its
    accounting rules): a pair routed over several links counts on every link it crosses, as the netns backend's
    gateways count it. Fields as testbed.agents.tc.LinkCounters: tx bytes, tx packets, rx bytes, rx packets,
    drops."""

    def __init__(self, plan: HostsPlan) -> None:
        self.plan = plan
        self.rows = {end.key: [0, 0, 0, 0, 0] for end in plan.link_ends if end.kind == "inter-dc"}

    def _add(self, pair: str, values: dict[int, int]) -> None:
        for hop in self.plan.pair_hops.get(pair, ()):
            for index, value in values.items():
                self.rows[hop][index] += value

    def add_qdiscs(self, item: HostPlan, qdiscs: list[dict]) -> None:
        """What `tc -s -j qdisc show` said on `item`'s interface: each peer class's leaf."""
        for peer, classid in item.classes.items():
            for qdisc in qdiscs:
                if qdisc.get("parent") == classid:
                    self._add(direction_key(item.node.dc, peer), {0: qdisc.get("bytes", 0),
                                                                   1: qdisc.get("packets", 0),
                                                                   4: qdisc.get("drops", 0)})

    def add_received(self, pair: str, rx_bytes: int, rx_packets: int) -> None:
        """What a receiving host's accounting rule counted arriving over `pair`."""
        self._add(pair, {2: rx_bytes, 3: rx_packets})

    def counters(self) -> dict[str, tuple[int, ...]]:
        return {key: tuple(values) for key, values in self.rows.items()}

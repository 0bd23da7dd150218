"""The seam between plans and backends: one typed view of a testbed that every backend's plan extends.

A backend's plan (testbed.plan.network.NetworkPlan for netns, testbed.plan.containers.ContainersPlan for docker,
testbed.plan.hosts.HostsPlan for ssh, ...) is a `TestbedView` subclass: these fields, plus what only that backend
builds (namespaces and veths, docker networks and containers, per-host commands). What reads a testbed without
building it (the runner, the probe, reports, `status`) reads only the view: its nodes, its shaped link ends (one
`Shaping` each, testbed.plan.shaping, rendered by whichever renderer the backend applies with), its inter-DC
links, the shaper and the prefix. `testbed.fabric.backend.Backend[PlanT]` and `testbed.fabric.base.Fabric[PlanT]`
are generic in the plan type, bound to this class.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, TypeVar

from testbed.plan.shaping import Shaper, Shaping

# a plan's shaper: a resolved one, or "auto" where the backend resolves it only when it builds (docker's routers)
PlanShaper = Shaper | Literal["auto"]


@dataclass(frozen=True)
class Node:
    """One node of the topology where it runs: `ns` is its namespace, container or host name."""

    name: str
    dc: str
    dc_index: int
    index: int
    ns: str
    address: str


@dataclass(frozen=True)
class LinkEnd:
    """A shaped egress point: `key` names it in status tables, counters and `shape`; `ns` and `ifname` say where
    (a namespace or container and its interface; on real hosts the hosts and their class)."""

    key: str
    kind: str  # "inter-dc" | "access" | "routed" (a DC pair without a direct link, shaped end to end: real hosts)
    ns: str
    ifname: str
    shaping: Shaping


@dataclass(frozen=True)
class InterDCLink:
    """One inter-DC link: its two direction keys and each end's address on it."""

    index: int
    a: str
    b: str
    forward: str  # LinkEnd key a->b
    backward: str  # LinkEnd key b->a
    a_address: str
    b_address: str


@dataclass(frozen=True)
class TestbedView:
    """What every backend's plan is: the topology's name, the prefix every object carries, the shaper, the nodes,
    every shaped link end and the inter-DC links. Subclasses add their backend's own layout (keyword fields)."""

    __test__ = False  # not a pytest test class, whatever its name

    topology: str
    prefix: str
    shaper: PlanShaper
    nodes: tuple[Node, ...]
    link_ends: tuple[LinkEnd, ...]
    links: tuple[InterDCLink, ...]

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node named {name!r} (nodes: {', '.join(n.name for n in self.nodes)})")

    def link_end(self, key: str) -> LinkEnd:
        for end in self.link_ends:
            if end.key == key:
                return end
        raise KeyError(key)

    def not_applied(self) -> dict[str, tuple[str, ...]]:
        """Link end -> what no mechanism applies on it (reported, never hidden)."""
        return {end.key: end.shaping.not_applied for end in self.link_ends if end.shaping.not_applied}

    def reshaped(self: ViewT, shapings: dict[str, Shaping]) -> ViewT:
        """The same plan with some link ends' shaping replaced (a live `shape` or fault): kept true to the kernel."""
        return replace(self, link_ends=tuple(replace(end, shaping=shapings[end.key]) if end.key in shapings else end
                                             for end in self.link_ends))


ViewT = TypeVar("ViewT", bound=TestbedView)

"""The network as the model sees it: per ordered DC pair, the routed path's one-way latency, bottleneck
bandwidth, loss and the inter-DC link directions it crosses, from the topology (routes are planned once
from it) and a cell's link parameters (a sweep changes them, not the routes)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from testbed.plan.routing import compose, shortest_paths
from testbed.spec.link import LinkParams
from testbed.spec.topology import Topology


def direction_key(src: str, dst: str) -> str:
    return f"{src}->{dst}"


@dataclass(frozen=True)
class Path:
    """One direction between two DCs. bandwidth None: unshaped."""

    latency: float  # one-way, seconds
    bandwidth: float | None  # bits/s, the slowest link of the route
    loss: float = 0.0
    hops: tuple[str, ...] = ()  # direction keys of the inter-DC links crossed, in order
    measured_rtt: float | None = None  # seconds, when a probe measured this pair


@dataclass(frozen=True)
class Network:
    dcs: tuple[str, ...]
    sizes: tuple[int, ...]  # ranks per DC
    paths: dict[tuple[int, int], Path] = field(default_factory=dict)  # (src DC index, dst DC index)

    @property
    def world(self) -> int:
        return sum(self.sizes)

    def dc_of(self, rank: int) -> int:
        start = 0
        for index, size in enumerate(self.sizes):
            if rank < start + size:
                return index
            start += size
        raise ValueError(f"rank {rank} outside the layout")

    def dc_start(self, dc: int) -> int:
        return sum(self.sizes[:dc])

    def path(self, src_dc: int, dst_dc: int) -> Path | None:
        """None inside a DC."""
        return None if src_dc == dst_dc else self.paths[(src_dc, dst_dc)]

    def rtt(self, a: int, b: int) -> float:
        there, back = self.paths[(a, b)], self.paths[(b, a)]
        if there.measured_rtt is not None:
            return there.measured_rtt
        return there.latency + back.latency

    def link_keys(self) -> list[str]:
        keys: list[str] = []
        for path in self.paths.values():
            for key in path.hops:
                if key not in keys:
                    keys.append(key)
        return sorted(keys)

    def inter_groups(self) -> list[list[int]]:
        """The workload's inter-DC groups: with n the smallest DC's size, group k holds every rank whose index in
        its DC is k modulo n."""
        n = min(self.sizes)
        return [[self.dc_start(dc) + i for dc in range(len(self.sizes)) for i in range(self.sizes[dc]) if i % n == k]
                for k in range(n)]


def _params(value: LinkParams | Mapping[str, Any]) -> LinkParams:
    return value if isinstance(value, LinkParams) else LinkParams(**{k: value[k] for k in (
        "latency", "bandwidth", "jitter", "loss") if k in value})


def build_network(topology: Topology, links: Mapping[str, LinkParams | Mapping[str, Any]], ranks_per_node: int = 1,
                  rtts: Mapping[tuple[str, str], float] | None = None) -> Network:
    """Paths between every pair of DCs with the given per-direction link parameters (`links`: direction key ->
    LinkParams or its fields, as in a cell). `rtts`: measured round trips (s) per (src, dst) DC names."""
    names = tuple(dc.name for dc in topology.dcs)
    sizes = tuple(dc.nodes * ranks_per_node for dc in topology.dcs)
    params = {key: _params(value) for key, value in links.items()}
    paths: dict[tuple[int, int], Path] = {}
    for a, src in enumerate(names):
        routes = shortest_paths(topology, src)
        for b, dst in enumerate(names):
            if a == b:
                continue
            route = routes[dst]
            hops = tuple(direction_key(x, y) for x, y in itertools.pairwise(route))
            end_to_end = compose([params[hop] for hop in hops])  # as the real-host backends shape the pair
            measured = (rtts or {}).get((src, dst))
            paths[(a, b)] = Path(end_to_end.latency, end_to_end.bandwidth, end_to_end.loss, hops, measured)
    return Network(names, sizes, paths)

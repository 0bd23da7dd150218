"""Which neighbouring DC each gateway forwards to, for every destination DC (shortest path by latency)."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from testbed.spec.topology import Topology


def _weights(topology: Topology) -> dict[str, dict[str, float]]:
    """Symmetric edge weights (mean of both directions' latency, plus a hop cost) so paths are symmetric."""
    graph: dict[str, dict[str, float]] = {dc.name: {} for dc in topology.dcs}
    for link in topology.links:
        a, b = link.between
        weight = (link.forward().latency + link.backward().latency) / 2 + 1e-6  # 1 us per hop breaks ties
        graph[a][b] = graph[b][a] = weight
    return graph


def shortest_paths(topology: Topology, source: str) -> dict[str, list[str]]:
    """DC name -> the list of DCs from `source` to it (inclusive), by Dijkstra with name tie-breaks."""
    graph = _weights(topology)
    best: dict[str, tuple[float, list[str]]] = {}
    queue: list[tuple[float, list[str]]] = [(0.0, [source])]
    while queue:
        cost, path = heapq.heappop(queue)
        here = path[-1]
        if here in best:
            continue
        best[here] = (cost, path)
        for peer, weight in sorted(graph[here].items()):
            if peer not in best:
                heapq.heappush(queue, (cost + weight, [*path, peer]))
    return {name: path for name, (_, path) in best.items()}


def next_hops(topology: Topology) -> dict[str, dict[str, str]]:
    """source DC -> {destination DC -> neighbouring DC to forward to}."""
    table: dict[str, dict[str, str]] = {}
    for dc in topology.dcs:
        paths = shortest_paths(topology, dc.name)
        table[dc.name] = {dest: path[1] for dest, path in paths.items() if dest != dc.name}
    return table

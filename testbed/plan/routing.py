"""Routes between DCs: which neighbouring DC each gateway forwards to, for every destination DC (shortest path by
latency), and what a route is end to end (`compose`: one definition, read by the real-host backends' plan and by
the model)."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from testbed.spec.link import LinkParams

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


def route_hops(topology: Topology, src: str, dst: str) -> tuple[tuple[str, str], ...]:
    """The (from, to) DC pairs of every inter-DC link a packet from `src` to `dst` crosses, in order: the netns
    backend's route (shortest_paths), which the model and the real-host backends compose."""
    path = shortest_paths(topology, src)[dst]
    return tuple(itertools.pairwise(path))


def compose(hops: Sequence[LinkParams]) -> LinkParams:
    """One direction of a route end to end, from its hops' parameters in order: delays add, the narrowest hop's
    rate, losses combine (1 - prod(1 - p)), jitters add as independent variances (a uniform spread of half-width
    sqrt(sum j^2) has their summed variance), and the queue is sized to the composed bandwidth-delay product
    (auto) unless a hop has a queue of its own: then the route holds what its hops hold, their queues summed."""
    if not hops:
        raise ValueError("a route crosses at least one link")
    if len(hops) == 1:
        return hops[0]
    rates = [hop.bandwidth for hop in hops if hop.bandwidth is not None]
    keep = math.prod(1 - hop.loss for hop in hops)
    queue = None if all(hop.queue is None for hop in hops) else sum(hop.queue_packets() for hop in hops)
    return LinkParams(latency=sum(hop.latency for hop in hops), bandwidth=min(rates) if rates else None,
                      jitter=math.sqrt(sum(hop.jitter ** 2 for hop in hops)), loss=1 - keep, queue=queue)

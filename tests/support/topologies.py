"""Small topologies for tests, written once: a topology file's data from DC sizes and links (`topology_data`), the
validated Topology (`make_topology`), and the pair most tests use, east and west with one link (`pair_data`,
`pair_topology`); a link's data: `link_data`.
The data is what a user's file holds (units as strings), so a test reads as the file it stands for."""

from __future__ import annotations

from typing import Any

from testbed.spec.topology import Topology, topology_from_data


def link_data(a: str, b: str, **fields: Any) -> dict[str, Any]:
    """One link of a topology file, between DCs `a` and `b`, with `fields` (latency="5ms", reverse={...}, ...)."""
    return {"between": [a, b], **fields}


def topology_data(name: str, dcs: dict[str, int], links: list[dict[str, Any]] | None = None,
                  **fields: Any) -> dict[str, Any]:
    """A topology file's data: each DC of `dcs` with its node count, in order; `links` (no key at all when None,
    as a one-DC file has none); any other top-level `fields` (subnet=..., tcp=...)."""
    data: dict[str, Any] = {"name": name, **fields, "dcs": [{"name": dc, "nodes": nodes} for dc, nodes in dcs.items()]}
    if links is not None:
        data["links"] = links
    return data


def make_topology(name: str, dcs: dict[str, int], links: list[dict[str, Any]] | None = None, *, si: bool = False,
             **fields: Any) -> Topology:
    """`topology_data(...)` validated (si=True: bare numbers are SI base units, as testbed writes them)."""
    return topology_from_data(topology_data(name, dcs, links, **fields), si=si)


def pair_data(name: str = "pair", *, east: int = 1, west: int = 1, **fields: Any) -> dict[str, Any]:
    """Two DCs, east and west, of `east` and `west` nodes, and one link between them with `fields`."""
    return topology_data(name, {"east": east, "west": west}, [link_data("east", "west", **fields)])


def pair_topology(name: str = "pair", *, east: int = 1, west: int = 1, **fields: Any) -> Topology:
    """`pair_data(...)` validated."""
    return topology_from_data(pair_data(name, east=east, west=west, **fields))

"""IPv4 addresses for every DC LAN, gateway, node and inter-DC link, carved from the topology's subnet."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from testbed.spec.subnet import lan_prefixlen

if TYPE_CHECKING:
    from testbed.spec.topology import Topology


@dataclass(frozen=True)
class DCAddresses:
    lan: ipaddress.IPv4Network
    gateway: ipaddress.IPv4Address
    nodes: tuple[ipaddress.IPv4Address, ...]


@dataclass(frozen=True)
class LinkAddresses:
    """A /31 point-to-point subnet: `a` sits on between[0]'s gateway, `b` on between[1]'s."""

    network: ipaddress.IPv4Network
    a: ipaddress.IPv4Address
    b: ipaddress.IPv4Address


@dataclass(frozen=True)
class Addressing:
    dcs: dict[str, DCAddresses]
    links: tuple[LinkAddresses, ...]



def allocate(topology: Topology) -> Addressing:
    """DC i gets the i-th LAN block (gateway .1, nodes from .2); links get /31s in the blocks after them."""
    subnet = ipaddress.IPv4Network(topology.subnet)
    max_nodes = max(dc.nodes for dc in topology.dcs)
    prefix = lan_prefixlen(subnet, len(topology.dcs), max_nodes, len(topology.links))
    blocks = subnet.subnets(new_prefix=prefix)
    dcs: dict[str, DCAddresses] = {}
    for dc in topology.dcs:
        lan = next(blocks)
        base = lan.network_address
        dcs[dc.name] = DCAddresses(lan=lan, gateway=base + 1,
                                   nodes=tuple(base + 2 + index for index in range(dc.nodes)))
    links: list[LinkAddresses] = []
    pairs = iter(())
    for _ in topology.links:
        pair = next(pairs, None)
        if pair is None:
            pairs = next(blocks).subnets(new_prefix=31)
            pair = next(pairs)
        links.append(LinkAddresses(network=pair, a=pair.network_address, b=pair.network_address + 1))
    return Addressing(dcs=dcs, links=tuple(links))

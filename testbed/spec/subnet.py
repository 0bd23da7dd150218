"""How a topology's subnet is cut: the size of every DC's LAN block (pure arithmetic on the spec).

A topology whose subnet cannot hold its DCs and links is refused when the file loads; the plan carves the
addresses with the same figure (testbed.plan.addressing)."""

from __future__ import annotations

import ipaddress
import math


def lan_prefixlen(subnet: ipaddress.IPv4Network, n_dcs: int, max_nodes: int, n_links: int) -> int:
    """The prefix length of every DC's LAN: a readable /24 where the subnet has room for it, else the smallest
    block that holds the largest DC (nodes + gateway + network + broadcast); the inter-DC /31s follow the LANs."""
    tight = 32 - math.ceil(math.log2(max_nodes + 3))
    for prefix in (min(24, tight), tight):
        if prefix < subnet.prefixlen:
            continue
        block = 2 ** (32 - prefix)
        link_blocks = math.ceil(2 * n_links / block)
        if (n_dcs + link_blocks) * block <= subnet.num_addresses:
            return prefix
    raise ValueError(f"{subnet} is too small for {n_dcs} DCs of up to {max_nodes} nodes and {n_links} links")

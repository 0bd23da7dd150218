"""The kernel settings every emulated node and router gets, one definition for every backend: netns writes them
under /proc/sys in each namespace, docker hands them to the engine per container. Keys as sysctl(8) and docker
name them (dotted)."""

from __future__ import annotations

from testbed.spec.topology import Topology

NODE_SYSCTLS = {
    "net.ipv6.conf.all.disable_ipv6": "1",
    "net.ipv6.conf.default.disable_ipv6": "1",
    # Long fat links need large TCP windows: 1 Gbit/s x 100 ms is 12.5 MB in flight.
    "net.ipv4.tcp_rmem": "4096 131072 268435456",
    "net.ipv4.tcp_wmem": "4096 65536 268435456",
}
ROUTER_SYSCTLS = {
    **NODE_SYSCTLS,
    "net.ipv4.ip_forward": "1",
    "net.ipv4.conf.all.rp_filter": "0",
    "net.ipv4.conf.default.rp_filter": "0",
    # a node's packet to outside the testbed (its resolver's DNS server, when c10d looks a peer's name up) is
    # answered "unreachable" every time: at the default of one ICMP per second per destination, lookups within a
    # second of others waited out the resolver's 5 s timeout (a restart's rendezvous took 5.1 s instead of 0.1 s)
    "net.ipv4.icmp_ratelimit": "0",
}


def node_sysctls(topology: Topology) -> dict[str, str]:
    """What a node of `topology` gets: NODE_SYSCTLS, and its congestion control where the topology names one (a
    namespace or container otherwise takes the host's)."""
    chosen = topology.tcp.congestion_control
    return {**NODE_SYSCTLS, **({"net.ipv4.tcp_congestion_control": chosen} if chosen else {})}


def proc_paths(sysctls: dict[str, str]) -> dict[str, str]:
    """The same settings keyed by their path under /proc/sys (net.ipv4.ip_forward -> net/ipv4/ip_forward)."""
    return {key.replace(".", "/"): value for key, value in sysctls.items()}

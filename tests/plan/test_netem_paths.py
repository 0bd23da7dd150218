"""Every shipped topology's netem trees, walked along the planned routes (root-free): a packet between any two nodes
crosses netem at most once per link end and never the same end twice, and a ping marked UNSHAPED_DSCP takes the
class beside netem on every shaped inter-DC end (issue 53, item 1).

The routes are followed from the plan's own route tables and addresses, hop by hop (not from the shortest-path
helper the probe uses), and a packet is classified by both renderers' filters: the u32 key netlink gets
(testbed.agents.tc) and the one `tc` argv gives (testbed.plan.shaping.tc_argv), applied to IPv4 headers.
"""

from __future__ import annotations

import ipaddress
import itertools
import struct
from pathlib import Path

import pytest

from testbed.agents.tc import netlink_requests
from testbed.plan.delayline import UNSHAPED_DSCP
from testbed.plan.network import NetworkPlan, build_plan
from testbed.plan.shaping import UNSHAPED_MINOR, Shaping, shaping_argv, tc_handle
from testbed.spec.topology import load_topology

TOPOLOGIES = sorted((Path(__file__).resolve().parents[2] / "topologies").glob("*.yaml"))


def ip_header(tos: int, protocol: int = 17) -> bytes:
    """The first 20 bytes of an IPv4 packet with this TOS byte (UDP unless `protocol` says otherwise)."""
    return struct.pack("!BBHHHBBH4s4s", 0x45, tos, 60, 1, 0, 64, protocol, 0, bytes(4), bytes(4))


def u32_matches(key: str, header: bytes) -> bool:
    """Whether a netlink u32 key 'value/mask+offset' matches a packet's header."""
    value_mask, offset = key.split("+")
    value, mask = (int(part, 16) for part in value_mask.split("/"))
    word = struct.unpack_from("!I", header, int(offset))[0]
    return word & mask == value & mask


def argv_matches(argv: list[str], header: bytes) -> bool:
    """Whether a `tc filter ... u32 match u32 VALUE MASK at OFFSET` line matches a packet's header."""
    at = argv.index("match")
    assert argv[at + 1] == "u32", argv
    value, mask, offset = int(argv[at + 2], 16), int(argv[at + 3], 16), int(argv[at + 5])
    return struct.unpack_from("!I", header, offset)[0] & mask == value & mask


def classify(shaping: Shaping, header: bytes) -> tuple[int, int]:
    """The htb class a packet takes under this tree, by the netlink filters and by the tc argv ones (they must
    agree): the first filter that matches, else the root's default class."""
    root = next(obj for obj in shaping.tc if obj.kind == "htb" and obj.what == "qdisc")
    default = root.handle | root.options["default"]
    by_netlink = next((request["target"] for verb, _, request in netlink_requests(shaping, 1)
                       if verb == "add-filter" and any(u32_matches(key, header) for key in request["keys"])), default)
    filters = [argv for argv in shaping_argv(shaping, "dev0") if argv[1] == "filter"]
    flowid = next((argv[argv.index("flowid") + 1] for argv in filters if argv_matches(argv, header)), None)
    by_argv = default if flowid is None else tc_handle(*(int(part, 16) for part in flowid.split(":")))
    return by_netlink, by_argv


def netem_parent(shaping: Shaping) -> int | str | None:
    """The class whose leaf is netem in this tree (None: no netem; 'root': netem is the root qdisc)."""
    return next((obj.parent for obj in shaping.tc if obj.kind == "netem"), None)


def hops(plan: NetworkPlan, src: str, dst: str) -> list[tuple[str, str]]:
    """The (namespace, egress interface) a packet from node `src` to node `dst` leaves through, by the plan's route
    tables: default route to the DC's gateway, then gateway to gateway by the routes to dst's LAN, then the LAN."""
    interfaces = [iface for pair in plan.veths for iface in (pair.a, pair.b)]
    owner = {iface.address.split("/")[0]: iface for iface in interfaces if iface.address}
    source, target = plan.node(src), plan.node(dst)
    out = [(source.ns, "eth0")]
    if source.dc == target.dc:
        port = next(i for i in interfaces if i.ns.endswith("-sw") and _peer(plan, i).ns == target.ns)
        return [*out, (port.ns, port.ifname)]
    here = plan.gateways[source.dc]
    seen: set[str] = set()
    while here != plan.gateways[target.dc]:
        assert here not in seen, f"{src}->{dst}: a routing loop through {here}"
        seen.add(here)
        route = next(r for r in plan.routes if r.ns == here and r.dst != "default"
                     and ipaddress.ip_address(target.address) in ipaddress.ip_network(r.dst))
        egress = next(i for i in interfaces if i.ns == here and i.address and
                      ipaddress.ip_address(route.gateway) in ipaddress.ip_interface(i.address).network)
        out.append((here, egress.ifname))
        here = owner[route.gateway].ns
    lan_port = next(i for i in interfaces if i.ns == f"{plan.prefix}{target.dc}-sw" and _peer(plan, i).ns ==
                    target.ns)
    return [*out, (here, "lan"), (lan_port.ns, lan_port.ifname)]


def _peer(plan: NetworkPlan, iface):
    return next(pair.b if pair.a == iface else pair.a for pair in plan.veths if iface in (pair.a, pair.b))


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_no_path_crosses_netem_twice_and_marked_pings_skip_it_on_every_hop(path):
    topology = load_topology(path)
    plan = build_plan(topology, "netem", "tb-")
    ends = {(end.ns, end.ifname): end for end in plan.link_ends}
    assert any(end.kind == "inter-dc" for end in ends.values()), path
    unmarked, marked = ip_header(0), ip_header(UNSHAPED_DSCP << 2)
    probe_ping, icmp = ip_header((UNSHAPED_DSCP << 2) | 0x01), ip_header(0, protocol=1)  # an ECN bit set; ICMP
    checked = 0
    for src, dst in itertools.permutations([node.name for node in plan.nodes], 2):
        route = hops(plan, src, dst)
        assert len(route) == len(set(route)), (src, dst, route)  # no egress crossed twice
        for hop in route:
            end = ends.get(hop)
            if end is None or netem_parent(end.shaping) is None:
                continue
            assert [obj.kind for obj in end.shaping.tc].count("netem") == 1, (end.key, end.shaping.tc)
            if end.kind != "inter-dc":
                continue
            netem_class = netem_parent(end.shaping)
            assert end.shaping.marked_undelayed and netem_class != "root", end.key
            beside = tc_handle(1, UNSHAPED_MINOR)
            assert not any(obj.kind == "netem" and obj.parent == beside for obj in end.shaping.tc), end.key
            for header, expected in ((unmarked, netem_class), (icmp, netem_class), (marked, beside),
                                     (probe_ping, beside)):
                assert classify(end.shaping, header) == (expected, expected), (src, dst, end.key, header[1])
            checked += 1
    assert checked > 0, path

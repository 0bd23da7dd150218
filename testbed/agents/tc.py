"""The netlink renderer of a link end's Shaping (testbed.plan.shaping; its other renderer, tc argv, is
testbed.plan.shaping.tc_argv), and applying it through any pyroute2 handle: the docker router agent does it inside
its container (IPRoute), the netns backend from the controller (NetNS). Add a tree, change it live, read an
interface's counters."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from pyroute2.iproute.linux import get_arguments_processor
from pyroute2.netlink.rtnl import TC_H_ROOT
from pyroute2.protocols import ETH_P_IP

from testbed.agents.kernel import needs
from testbed.plan.shaping import ROOT, Shaping, TcObject, tos_key


@dataclass(frozen=True)
class LinkCounters:
    """Kernel counters of one shaped egress interface."""

    tx_bytes: int
    tx_packets: int
    rx_bytes: int
    rx_packets: int
    qdisc_drops: int


def tc_request(command: str, obj: TcObject, index: int) -> tuple[str, dict[str, Any]]:
    """The verb and the normalised pyroute2 request of one `tc qdisc|class add|change` on interface `index`.

    pyroute2 turns the keywords into the qdisc's options (netem: TCA_NETEM_RATE from `rate`) and then also
    encodes every keyword that names a tcmsg attribute: `rate` becomes a top-level TCA_RATE (a rate
    estimator, a byte string), which fails with "object of type 'int' has no len()". Its classifiers drop
    `rate` in a fix_request hook; netem has none (pyroute2 0.9.7, and upstream as of 2026-01). Our objects
    never ask for a rate estimator, so the top-level `rate` is dropped here for every kind, once.
    A u32 filter's `dst` becomes pyroute2's key on the IPv4 destination (offset 16), its `tos` one on the
    header's first word (shaping.tos_key), its flowid the target.
    """
    verb = command if obj.what == "qdisc" else f"{command}-{obj.what}"
    if obj.what == "filter":
        kwargs: dict[str, Any] = {"kind": obj.kind, "index": index, "protocol": ETH_P_IP, **_u32(obj.options)}
    else:
        kwargs = {**obj.options, "kind": obj.kind, "index": index, "handle": obj.handle}
    if obj.parent != ROOT:
        kwargs["parent"] = obj.parent
    request = get_arguments_processor("tc", verb, kwargs)
    dict.pop(request, "rate", None)
    return verb, request


def _u32(options: dict[str, Any]) -> dict[str, Any]:
    if set(options) == {"prio", "tos", "flowid"}:
        value, mask = tos_key(options["tos"])
        key = f"0x{value:08x}/0x{mask:08x}+0"
    elif set(options) == {"prio", "dst", "flowid"}:
        net = ipaddress.IPv4Network(options["dst"])
        key = f"0x{int(net.network_address):08x}/0x{int(net.netmask):08x}+16"
    else:
        raise ValueError(f"no netlink rendering of u32 options {sorted(options)}")
    return {"prio": options["prio"], "target": options["flowid"], "keys": [key]}


def netlink_requests(shaping: Shaping, index: int, command: str = "add") -> list[tuple[str, str, dict[str, Any]]]:
    """The netlink renderer: (verb, kind, request) of every object of a link end's tree on interface `index`, in
    order (`change`: only what a live change touches, Shaping.changed)."""
    out = []
    for obj in shaping.tc if command == "add" else shaping.changed():
        verb, request = tc_request(command, obj, index)
        out.append((verb, obj.kind, request))
    return out


def tc_call(handle: Any, command: str, obj: TcObject, index: int) -> None:
    """One `tc qdisc|class add|change` of a planned object on interface `index`."""
    verb, request = tc_request(command, obj, index)
    handle.tc(verb, obj.kind, index=index, request_filter=request)


def add_tree(handle: Any, index: int, shaping: Shaping, where: str = "") -> None:
    """Add every planned object; a qdisc the kernel lacks is one line naming it (`where`: the interface)."""
    for obj in shaping.tc:
        module = f"cls_{obj.kind}" if obj.what == "filter" else f"sch_{obj.kind}"
        with needs(module, f"tc {obj.what} add {obj.kind} on {where or f'interface {index}'}"):
            tc_call(handle, "add", obj, index)


def change_tree(handle: Any, index: int, old: Shaping, new: Shaping) -> None:
    """`tc change` in place when the tree keeps its shape (flows in flight keep their queue), else rebuild."""
    same_tree = [(o.what, o.kind, o.handle) for o in old.tc] == [(o.what, o.kind, o.handle) for o in new.tc]
    if same_tree:
        for obj in new.changed():  # the root htb qdisc has nothing to change
            tc_call(handle, "change", obj, index)
        return
    if old.tc:  # e.g. a rate appears on an unshaped link
        handle.tc("del", index=index, handle=old.tc[0].handle, parent=TC_H_ROOT)
    add_tree(handle, index, new)


def interface_counters(handle: Any, ifname: str) -> LinkCounters:
    """Interface byte/packet counters and the drops of every qdisc on it."""
    link = handle.get_links(handle.link_lookup(ifname=ifname)[0])[0]
    stats = link.get_attr("IFLA_STATS64")
    drops = sum((q.get_attr("TCA_STATS2") or {}).get_attr("TCA_STATS_QUEUE")["drops"]
                for q in handle.get_qdiscs(index=link["index"]) if q.get_attr("TCA_STATS2"))
    return LinkCounters(stats["tx_bytes"], stats["tx_packets"], stats["rx_bytes"], stats["rx_packets"], drops)

"""The plan for real hosts over SSH: which host plays which node, and the tc/iptables commands that shape
its inter-DC traffic per peer DC, with the commands that undo them. Pure: argv lists, nothing touches a host.

On each host, on the interface the inventory names:
  root  htb 7e57:                      unclassified traffic (intra-DC, SSH) passes unshaped
  class 7e57:<10+k> per peer DC k      rate = the link's bandwidth, u32 filters on the peer DC's addresses
  leaf  netem (delay, jitter, loss, BDP limit) or, without netem, a pfifo of the same limit and the
        userspace delay line on the *receiving* host (iptables mangle PREROUTING -s peers -> NFQUEUE)
  iptables accounting rules count what arrives from each peer DC (the link's rx counters).
Every iptables rule carries the comment `testbed:<prefix>`, so undo finds them even after a crash.

Semantics differ from the netns backend in one way, said in README and manifests: a DC link's bandwidth
is applied per host (each host's class), since hosts in a rack do not share one emulated WAN port.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.plan.delayline import DelayDirection
from testbed.plan.network import InterDCLink, LinkEnd, NetworkPlan, Node, direction_key, link_direction_params
from testbed.plan.shaping import Shaper, Shaping, htb_burst, netem_options, plan_shaping, queue_limit
from testbed.spec.errors import SpecError
from testbed.spec.inventory import HostSpec, Inventory
from testbed.spec.link import LinkParams
from testbed.spec.topology import Topology

ROOT_MAJOR = 0x7E57
ROOT_HANDLE = f"{ROOT_MAJOR:x}:"
UNCAPPED_RATE = 100e9  # bits/s of a class whose link has no bandwidth cap (the class exists to hold the leaf)


def comment(prefix: str) -> str:
    return f"testbed:{prefix}"


@dataclass(frozen=True)
class HostPlan:
    """One host: the node it plays, and its shaping as commands (argv lists run with the host's sudo)."""

    node: Node
    host: HostSpec
    workdir: str
    apply: tuple[tuple[str, ...], ...]
    delay_line: tuple[DelayDirection, ...]
    classes: dict[str, str]  # peer DC -> classid on this host's interface


@dataclass(frozen=True)
class HostsPlan:
    network: NetworkPlan  # nodes and inter-DC link ends, as the runner, probe and reports read them
    hosts: tuple[HostPlan, ...]
    inventory_file: str | None = None

    def host(self, name: str) -> HostPlan:
        for item in self.hosts:
            if name in (item.node.name, item.host.name):
                return item
        raise KeyError(f"no node or host named {name!r} "
                       f"(nodes: {', '.join(f'{h.node.name} ({h.host.name})' for h in self.hosts)})")


def workdir(host: HostSpec, prefix: str) -> str:
    """Where everything testbed puts on the host lives (code, configs, logs, metrics); removed by undo."""
    return f"{host.workdir.rstrip('/')}/{prefix}{host.name}"


MEMORY_ROOT = "/dev/shm"  # a tmpfs on nearly every Linux host, writable by every user


def memory_dir(host: HostSpec, prefix: str) -> str:
    """Where the host's delay-line files go when MEMORY_ROOT is a tmpfs there (its workdir otherwise): a live
    re-shape rewrites its configuration and the worker its figures, and neither may wait on a busy disk."""
    return f"{MEMORY_ROOT}/{prefix}{host.name}"


def match_inventory(topology: Topology, inventory: Inventory, source: str | None = None) -> list[tuple[Node, HostSpec]]:
    """Hosts in topology order: DC by DC, node i of a DC played by the DC's i-th inventory host."""
    names = [dc.name for dc in topology.dcs]
    for dc in inventory.dcs:
        if dc not in names:
            raise SpecError(source, f"dcs.{dc}", f"topology {topology.name} has no DC {dc!r} (DCs: {', '.join(names)})")
    out: list[tuple[Node, HostSpec]] = []
    for dc_index, dc in enumerate(topology.dcs):
        hosts = inventory.dcs.get(dc.name)
        if hosts is None:
            raise SpecError(source, "dcs", f"no hosts for DC {dc.name!r} of topology {topology.name}")
        if len(hosts) != dc.nodes:
            raise SpecError(source, f"dcs.{dc.name}", f"{len(hosts)} host(s) listed, topology {topology.name} has "
                            f"{dc.nodes} node(s) in {dc.name}")
        for index, (name, host) in enumerate(zip(dc.node_names(), hosts)):
            out.append((Node(name, dc.name, dc_index, index, host.name, host.address), host))
    addresses = [host.address for _, host in out]
    if len(set(addresses)) != len(addresses):
        raise SpecError(source, "dcs", "two hosts share an address; every node needs its own")
    return out


def _require_full_mesh(topology: Topology) -> None:
    names = [dc.name for dc in topology.dcs]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            try:
                topology.find_link(a, b)
            except KeyError:
                raise SpecError(topology.name, "links", "the ssh backend shapes traffic per peer DC, so every "
                                f"pair of DCs needs a direct link (none between {a} and {b})") from None


def _tc_rate(bits: float) -> str:
    return f"{int(bits)}bit"


def class_commands(dev: str, classid: str, params: LinkParams, shaper: Shaper, verb: str = "add") -> list[list[str]]:
    """The HTB class and its leaf for one peer DC; verb 'change' re-shapes in place (flows keep their queue)."""
    rate = params.bandwidth if params.bandwidth is not None else UNCAPPED_RATE
    burst = str(htb_burst(rate))
    minor = classid.split(":")[1]
    out = [["tc", "class", verb, "dev", dev, "parent", ROOT_HANDLE, "classid", classid, "htb", "rate", _tc_rate(rate),
            "ceil", _tc_rate(rate), "burst", burst, "cburst", burst, "quantum", "60000"]]
    limit = queue_limit(params)
    leaf = ["tc", "qdisc", verb, "dev", dev, "parent", classid, "handle", f"{minor}:"]
    if shaper == "netem":
        options = netem_options(params, limit)
        netem = [*leaf, "netem", "limit", str(limit), "delay", f"{options['delay']}us"]
        if options["jitter"]:
            netem += [f"{options['jitter']}us"]
        if options["loss"]:
            netem += ["loss", f"{options['loss']:.6g}%"]
        netem += ["rate", _tc_rate(options["rate"] * 8)]  # always: `tc change` without it keeps the old rate
        out.append(netem)
    else:
        out.append([*leaf, "pfifo", "limit", str(limit)])
    return out


def accounting_rule(dev: str, sources: tuple[str, ...], peer: str, prefix: str) -> list[str]:
    """An iptables rule with no target: its counters are the bytes that arrived from DC `peer`."""
    return ["iptables", "-w", "-t", "mangle", "-A", "PREROUTING", "-i", dev, "-s", ",".join(sources), "-m", "comment",
            "--comment", f"{comment(prefix)}:rx:{peer}"]


def build_hosts_plan(topology: Topology, inventory: Inventory, shaper: Shaper, prefix: str,
                     overrides: dict[str, LinkParams] | None = None, inventory_file: str | None = None) -> HostsPlan:
    """Pure: every host's node, shaping commands and delay-line work for `topology` under `shaper`."""
    _require_full_mesh(topology)
    pairs = match_inventory(topology, inventory, inventory_file)
    nodes = tuple(node for node, _ in pairs)
    by_dc: dict[str, list[tuple[Node, HostSpec]]] = {}
    for node, host in pairs:
        by_dc.setdefault(node.dc, []).append((node, host))
    dc_names = [dc.name for dc in topology.dcs]
    addresses = {dc: tuple(host.address for _, host in by_dc[dc]) for dc in dc_names}
    classid = {dc: f"{ROOT_MAJOR:x}:{0x10 + index:x}" for index, dc in enumerate(dc_names)}

    ends: list[LinkEnd] = []
    links: list[InterDCLink] = []
    shaping: dict[tuple[str, str], Shaping] = {}
    for index, link in enumerate(topology.links):
        a, b = link.between
        for src, dst in ((a, b), (b, a)):
            shaping[(src, dst)] = plan_shaping(link_direction_params(topology, src, dst, overrides), shaper)
            ends.append(LinkEnd(direction_key(src, dst), "inter-dc", ",".join(h.name for _, h in by_dc[src]),
                                f"class {classid[dst]}", shaping[(src, dst)]))
        links.append(InterDCLink(index, a, b, direction_key(a, b), direction_key(b, a), addresses[a][0],
                                 addresses[b][0]))

    plans: list[HostPlan] = []
    for node, host in pairs:
        dev = host.interface
        apply: list[list[str]] = [["tc", "qdisc", "add", "dev", dev, "root", "handle", ROOT_HANDLE, "htb"]]
        delay: list[DelayDirection] = []
        peers = [dc for dc in dc_names if dc != node.dc]
        for peer in peers:
            apply += class_commands(dev, classid[peer], shaping[(node.dc, peer)].params, shaper)
            for address in addresses[peer]:
                apply.append(["tc", "filter", "add", "dev", dev, "parent", ROOT_HANDLE, "protocol", "ip", "prio", "1",
                              "u32", "match", "ip", "dst", f"{address}/32", "flowid", classid[peer]])
            apply.append(accounting_rule(dev, addresses[peer], peer, prefix))
            incoming = shaping[(peer, node.dc)].delay_line  # None under netem: the leaf delays
            if incoming is not None:
                delay.append(DelayDirection.serving(direction_key(peer, node.dc), dev, len(delay), incoming,
                                                    addresses[peer], comment(prefix)))
        plans.append(HostPlan(node, host, workdir(host, prefix), tuple(tuple(c) for c in apply), tuple(delay),
                              {peer: classid[peer] for peer in peers}))

    network = NetworkPlan(topology.name, prefix, shaper, (), (), (), (), tuple(ends), nodes, tuple(links), {})
    return HostsPlan(network, tuple(plans), inventory_file)


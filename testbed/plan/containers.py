"""The docker layout of a topology, as plain data: networks, containers and each DC router's configuration.

One plan feeds both the docker SDK backend (`testbed up --backend docker`) and the compose generator
(`testbed compose`), so a laptop's `docker compose up` and the harness build the same thing:
  <prefix><dc>        a docker network per DC (the DC LAN: the topology's addresses, gateway .1)
  <prefix><a>-<b>     a docker network per inter-DC link (a /29: routers at .2 and .3; docker keeps .1)
  <dc>-<i>            a node container per node, no extra capabilities, on its DC network only
  <dc>-gw             a router container per DC with NET_ADMIN, on its DC network and its links
Node containers cannot change their routes; docker gives them `default via .1`. Every network is created
with the bridge's IPv4 address inhibited, and the DC's router claims .1 itself (docker refuses to give a
container the gateway address), so traffic to other DCs goes through the router, where the links are
shaped exactly as in the netns backend (same tc trees, same userspace delay line).
Intra-DC access links are not shaped here: a capless node cannot shape its own interface.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from dataclasses import asdict, dataclass, field, replace

from testbed import settings
from testbed.plan import DEFAULT_PREFIX
from testbed.plan.addressing import allocate
from testbed.plan.network import NetworkPlan, build_plan, direction_key, link_direction_params
from testbed.plan.routing import next_hops
from testbed.plan.shaping import Shaper, Shaping, plan_shaping
from testbed.plan.sysctls import ROUTER_SYSCTLS, node_sysctls
from testbed.plan.view import LinkEnd, TestbedView
from testbed.spec.link import LinkParams
from testbed.spec.topology import Topology

LABEL = "testbed"  # every container, network and image carries it; its value is the testbed's prefix
LABEL_ROLE, LABEL_NODE, LABEL_DC = "testbed.role", "testbed.node", "testbed.dc"
DEFAULT_IMAGE = "testbed:latest"
ROUTER_COMMAND = ("python", "-m", "testbed.agents.router")  # + serve (a DC router) | idle (a node)
ROUTER_ENV = settings.ROUTER  # the router's configuration, RouterConfig as JSON
ROUTER_STATE_DIR = "/run/testbed"  # in memory (tmpfs): a fault's new delay-line configuration is written there
# while the cell runs, and a container's /run is on the docker host's disk, where one write can wait 0.26 s
ROUTER_READY = f"{ROUTER_STATE_DIR}/router.ready"
NETWORK_OPTIONS = {
    "com.docker.network.bridge.inhibit_ipv4": "true",  # the host gets no address: it never routes for us
    "com.docker.network.bridge.enable_ip_masquerade": "false",
}
LINK_PREFIXLEN = 29


@dataclass(frozen=True)
class DockerNetwork:
    name: str
    role: str  # "lan" | "link"
    subnet: str
    gateway: str


@dataclass(frozen=True)
class Attachment:
    network: str
    address: str


@dataclass(frozen=True)
class ContainerSpec:
    """One container (a compose service): `service` is its name in a compose file and in messages."""

    service: str
    role: str  # "node" | "router"
    dc: str
    attachments: tuple[Attachment, ...]
    command: tuple[str, ...]
    sysctls: dict[str, str] = field(default_factory=dict)
    cap_add: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)
    extra_hosts: tuple[tuple[str, str], ...] = ()  # (name, address): the other nodes, IPv4 and IPv4-mapped IPv6
    healthcheck: tuple[str, ...] = ()
    tmpfs: tuple[str, ...] = ()  # directories in memory: a router's state and delay-line files
    router: RouterConfig | None = None  # a router's configuration (also in `environment`, as its process reads it)

    def labels(self, prefix: str) -> dict[str, str]:
        labels = {LABEL: prefix, LABEL_ROLE: self.role, LABEL_DC: self.dc}
        if self.role == "node":
            labels[LABEL_NODE] = self.service
        return labels


@dataclass(frozen=True, kw_only=True)
class ContainersPlan(TestbedView):
    """The docker backend's plan: the view (nodes are containers named as the netns plan names their
    namespaces; inter-DC link ends are the routers' `to-<peer>`) and the networks and containers that make it.
    `shaper` is as requested until the routers resolve it (`with_shaper`): "auto" is decided by each router on
    the docker host's kernel; the link ends show userspace-delay for it, as the other backends' dry runs do."""

    networks: tuple[DockerNetwork, ...]
    containers: tuple[ContainerSpec, ...]

    def with_shaper(self, shaper: Shaper, overrides: dict[str, LinkParams] | None = None) -> ContainersPlan:
        """The plan as the routers applied it: `shaper` resolved, `overrides` (live changes) in force."""
        overrides = overrides or {}
        return replace(self, shaper=shaper, link_ends=tuple(
            replace(end, shaping=plan_shaping(overrides.get(end.key, end.shaping.params), shaper))
            if end.kind == "inter-dc" else end for end in self.link_ends))

    def container_name(self, spec: ContainerSpec) -> str:
        return f"{self.prefix}{spec.service}"

    def routers(self) -> tuple[ContainerSpec, ...]:
        return tuple(c for c in self.containers if c.role == "router")


def _link_networks(topology: Topology) -> list[ipaddress.IPv4Network]:
    """One /29 per inter-DC link, from where the netns plan's /31s start (after the DC LANs)."""
    addressing = allocate(topology)
    subnet = ipaddress.IPv4Network(topology.subnet)
    if not addressing.links:
        return []
    start = int(addressing.links[0].network.network_address)
    size = 2 ** (32 - LINK_PREFIXLEN)
    nets = [ipaddress.IPv4Network((start + index * size, LINK_PREFIXLEN)) for index in range(len(topology.links))]
    if not nets[-1].subnet_of(subnet):
        raise ValueError(f"subnet {subnet}: no room for {len(nets)} /{LINK_PREFIXLEN} link networks after the DC "
                         "LANs (docker needs more addresses per link than the netns backend); give a larger subnet")
    return nets


@dataclass(frozen=True)
class RouterRoute:
    dst: str  # a DC LAN, CIDR
    via: str  # the next router's address on a link network


@dataclass(frozen=True)
class RouterLinkEnd:
    """One direction of an inter-DC link at this router: shaped on egress, delayed on ingress."""

    key: str  # direction key, e.g. "east->west"
    ifname: str  # to-<peer>
    params: LinkParams


@dataclass(frozen=True)
class RouterConfig:
    """What the router of `dc` applies (testbed.agents.router reads it from the env, ROUTER_ENV): interface
    names by address, the gateway address it claims, routes, its egress link ends (tc) and the directions it
    delays on ingress (the userspace delay line)."""

    dc: str
    prefix: str
    shaper: str  # as requested: "auto" is resolved by the router on the docker host's kernel
    gateway: str  # CIDR
    interfaces: dict[str, str]  # address -> the name the router gives the interface holding it
    routes: tuple[RouterRoute, ...]
    egress: tuple[RouterLinkEnd, ...]
    ingress: tuple[RouterLinkEnd, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RouterConfig:
        from pydantic import TypeAdapter

        return TypeAdapter(cls).validate_json(text)


def router_config(topology: Topology, dc: str, prefix: str, shaper: str, lan_address: str,
                  links: dict[str, tuple[str, str]], overrides: dict[str, LinkParams] | None = None) -> RouterConfig:
    """The configuration of `dc`'s router. `links`: peer DC -> (this router's address on the link network, the
    peer router's address)."""
    addressing = allocate(topology)
    lan = addressing.dcs[dc]
    hops = next_hops(topology).get(dc, {})
    return RouterConfig(
        dc=dc, prefix=prefix, shaper=shaper, gateway=f"{lan.gateway}/{lan.lan.prefixlen}",
        interfaces={lan_address: "lan", **{mine: f"to-{peer}" for peer, (mine, _) in sorted(links.items())}},
        routes=tuple(RouterRoute(str(addressing.dcs[dst].lan), links[hop][1]) for dst, hop in sorted(hops.items())),
        egress=tuple(RouterLinkEnd(direction_key(dc, peer), f"to-{peer}",
                                   link_direction_params(topology, dc, peer, overrides)) for peer in sorted(links)),
        ingress=tuple(RouterLinkEnd(direction_key(peer, dc), f"to-{peer}",
                                    link_direction_params(topology, peer, dc, overrides)) for peer in sorted(links)))


def _peer_hosts(hosts: dict[str, str], me: str) -> tuple[tuple[str, str], ...]:
    """/etc/hosts entries for the other nodes. Without them gloo's rendezvous stalls on reverse lookups
    that docker's embedded DNS forwards to an upstream it cannot reach (10 s each); the TCP store sees its
    clients as IPv4-mapped IPv6 addresses, so those are listed too."""
    return tuple(pair for peer, address in hosts.items() if peer != me
                 for pair in ((peer, address), (peer, f"::ffff:{address}")))


def build_containers_plan(topology: Topology, shaper: str = "auto", prefix: str = DEFAULT_PREFIX,
                          overrides: dict[str, LinkParams] | None = None) -> ContainersPlan:
    """Pure: every docker network and container of `topology` (addresses as in the netns plan). `overrides`
    (live changes) show in the link ends; the routers start from the topology and are changed live."""
    addressing = allocate(topology)
    lans: list[DockerNetwork] = []
    link_nets: list[DockerNetwork] = []
    containers: list[ContainerSpec] = []
    hosts = {name: str(addressing.dcs[dc.name].nodes[index])
             for dc in topology.dcs for index, name in enumerate(dc.node_names())}
    router_links: dict[str, dict[str, tuple[str, str]]] = {dc.name: {} for dc in topology.dcs}
    link_attachments: dict[str, list[Attachment]] = {dc.name: [] for dc in topology.dcs}
    for link, net in zip(topology.links, _link_networks(topology)):
        a, b = link.between
        name = f"{prefix}{a}-{b}"
        link_nets.append(DockerNetwork(name, "link", str(net), str(net.network_address + 1)))
        addr_a, addr_b = str(net.network_address + 2), str(net.network_address + 3)
        router_links[a][b], router_links[b][a] = (addr_a, addr_b), (addr_b, addr_a)
        link_attachments[a].append(Attachment(name, addr_a))
        link_attachments[b].append(Attachment(name, addr_b))
    for dc in topology.dcs:
        dc_addr = addressing.dcs[dc.name]
        lan_name = f"{prefix}{dc.name}"
        lans.append(DockerNetwork(lan_name, "lan", str(dc_addr.lan), str(dc_addr.gateway)))
        router_address = dc_addr.lan.broadcast_address - 1
        if router_address in dc_addr.nodes:
            raise ValueError(f"DC {dc.name}: its LAN {dc_addr.lan} has no free address left for the DC router "
                             "container; give the topology a larger subnet")
        for _index, name in enumerate(dc.node_names()):
            containers.append(ContainerSpec(
                name, "node", dc.name, (Attachment(lan_name, hosts[name]),),
                (*ROUTER_COMMAND, "idle"), node_sysctls(topology),
                extra_hosts=_peer_hosts(hosts, name)))
        config = router_config(topology, dc.name, prefix, shaper, str(router_address), router_links[dc.name])
        containers.append(ContainerSpec(
            f"{dc.name}-gw", "router", dc.name,
            (Attachment(lan_name, str(router_address)), *link_attachments[dc.name]),
            (*ROUTER_COMMAND, "serve"), dict(ROUTER_SYSCTLS), ("NET_ADMIN",),
            {ROUTER_ENV: config.to_json(), settings.STATE_DIR: ROUTER_STATE_DIR},
            healthcheck=("CMD", "test", "-f", ROUTER_READY), tmpfs=(ROUTER_STATE_DIR,), router=config))
    net = build_plan(topology, "userspace-delay" if shaper == "auto" else shaper, prefix, overrides)
    return ContainersPlan(topology=topology.name, prefix=prefix, shaper=shaper, nodes=net.nodes,
                          link_ends=_docker_link_ends(net), links=net.links, networks=tuple(lans + link_nets),
                          containers=tuple(containers))


def _docker_link_ends(plan: NetworkPlan) -> tuple[LinkEnd, ...]:
    """The netns plan's link ends as docker has them: intra-DC access links stay unshaped (capless node
    containers cannot shape their own interfaces), and say so."""
    ends = []
    for end in plan.link_ends:
        if end.kind == "access":
            params = end.shaping.params
            missing = tuple(name for name, set_ in (("bandwidth", params.bandwidth is not None),
                                                    ("latency", params.latency > 0), ("jitter", params.jitter > 0),
                                                    ("loss", params.loss > 0)) if set_)
            end = dataclasses.replace(end, shaping=Shaping(end.shaping.shaper, params, (), None, missing))
        ends.append(end)
    return tuple(ends)

"""The job's shaping plan as data (what the job writes to the shared directory for the root step) and the plan of
every node derived from it, by the same builder the ssh backend uses (testbed.plan.hosts: HTB per peer DC by u32
filters on the peer's addresses, netem or a pfifo and the receiving node's userspace delay line).

The file holds inputs only (topology, shaper, prefix, overrides, which Slurm node plays which node and its
address), never commands: the root step (Prolog or `sudo -n`) derives the tc/iptables commands itself, so a user
cannot make root run anything but testbed's own shaping."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from testbed.plan.hosts import HostPlan, HostsPlan, build_hosts_plan
from testbed.spec.inventory import HostSpec, Inventory
from testbed.spec.link import LinkParams
from testbed.spec.topology import Topology, topology_from_data

WORKDIR_ROOT = "/var/tmp/testbed"  # node-local: <root>/<prefix><node> holds a node's run directory and logs
PREFIX_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,30}$")
COMMENT_TAG = "testbed:"  # the job's comment: testbed:<path of this file>


@dataclass(frozen=True)
class PlacedNode:
    """A testbed node and the Slurm node that plays it."""

    node: str  # the topology's name (east-0)
    dc: str
    slurm: str  # the Slurm node name
    address: str  # its address on the network the DCs share (NodeAddr, resolved)
    interface: str = ""  # the interface that carries it, once the node has said (empty before)


@dataclass
class JobPlan:
    """What the root step reads: everything the shaping of every node is derived from."""

    prefix: str
    shaper: str
    topology: dict[str, Any]
    nodes: list[PlacedNode]
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    job_id: str = ""
    root: str = ""  # "prolog": the Prolog shapes at the job's start; "sudo": the job does (the Epilog restores both)

    def dump(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def load(cls, text: str) -> JobPlan:
        data = json.loads(text)
        plan = cls(**{**data, "nodes": [PlacedNode(**item) for item in data["nodes"]]})
        if not PREFIX_PATTERN.match(plan.prefix):
            raise ValueError(f"prefix {plan.prefix!r}: expected letters, digits, _, . or - (at most 31)")
        return plan

    def topology_spec(self) -> Topology:
        return topology_from_data(self.topology, "job plan", si=True)

    def override_params(self) -> dict[str, LinkParams]:
        return {key: LinkParams(**value) for key, value in self.overrides.items()}

    def placed(self, slurm: str) -> PlacedNode:
        for item in self.nodes:
            if slurm in (item.slurm, item.node):
                return item
        raise KeyError(f"no node of this testbed runs on {slurm!r} "
                       f"(nodes: {', '.join(f'{n.node} ({n.slurm})' for n in self.nodes)})")


def plan_path(shared_dir: Path, prefix: str) -> Path:
    return shared_dir / f"{prefix.rstrip('-') or 'testbed'}.slurm.json"


def inventory_of(plan: JobPlan, interfaces: dict[str, str] | None = None) -> Inventory:
    """The placed nodes as the hosts builder reads them (SSH fields unused here: nothing is reached over SSH).
    A node's interface: `interfaces`, else the one it reported, else a stand-in until it has said."""
    interfaces = interfaces or {}
    dcs: dict[str, list[HostSpec]] = {}
    for item in plan.nodes:
        dcs.setdefault(item.dc, []).append(HostSpec(
            name=item.slurm, address=item.address, user="slurm", key="-", workdir=WORKDIR_ROOT,
            interface=interfaces.get(item.slurm) or item.interface or "unknown"))
    return Inventory(dcs=dcs)


def hosts_plan(plan: JobPlan, shaper: str | None = None, overrides: dict[str, LinkParams] | None = None,
               interfaces: dict[str, str] | None = None) -> HostsPlan:
    """Every node's shaping commands and delay-line work, as testbed.plan.hosts builds them for ssh hosts."""
    topology = plan.topology_spec()
    ordered = {dc.name: [] for dc in topology.dcs}
    for item in plan.nodes:
        ordered[item.dc].append(item)
    plan = JobPlan(plan.prefix, plan.shaper, plan.topology, [item for items in ordered.values() for item in items],
                   plan.overrides, plan.job_id, plan.root)
    chosen = shaper or plan.shaper
    return build_hosts_plan(topology, inventory_of(plan, interfaces), "userspace-delay" if chosen == "auto" else chosen,
                            plan.prefix, overrides if overrides is not None else plan.override_params())


@dataclass(frozen=True, kw_only=True)
class SlurmPlan(HostsPlan):
    """The Slurm backend's plan: the hosts plan (the view every reader shares, and each node's shaping) of the
    job plan it is derived from."""

    job: JobPlan = field(hash=False, compare=False)


def slurm_plan(plan: JobPlan) -> SlurmPlan:
    """hosts_plan() of `plan`, carrying it."""
    hosts = hosts_plan(plan)
    return SlurmPlan(**{item.name: getattr(hosts, item.name) for item in fields(hosts)}, job=plan)


def node_plan(plan: JobPlan, slurm: str, interface: str) -> HostPlan:
    """The shaping of the node that Slurm calls `slurm`, on `interface`."""
    placed = plan.placed(slurm)
    return hosts_plan(plan, interfaces={placed.slurm: interface}).host(placed.slurm)

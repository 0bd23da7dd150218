"""The Slurm backend as the registry knows it: which Slurm nodes play which DC (features, or a mapping), who shapes
them (the site's Prolog/Epilog, or `sudo -n`), refused in one line before anything is submitted when the cluster
or the allocation cannot give the topology its nodes or nobody can shape them; cleaning ends testbed's job (the
Epilog restores its nodes) and restores the nodes the state file names."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict

from testbed.fabric.backend import Backend, BackendOptions, Progress
from testbed.fabric.errors import FabricError
from testbed.fabric.slurm.cluster import assign, is_address, parse_dc_map, parse_job, parse_nodes
from testbed.fabric.slurm.fabric import SlurmFabric, can_be_root, end_job, find_job, restore_by_job, slurm
from testbed.fabric.slurm.jobplan import JobPlan, PlacedNode, SlurmPlan, plan_path, slurm_plan
from testbed.fabric.slurm.state import SlurmState
from testbed.fabric.state import FabricState
from testbed.spec.link import LinkParams
from testbed.spec.loader import validate_data
from testbed.spec.topology import Topology

Root = Literal["auto", "prolog", "sudo"]
DEFAULT_SHARED_DIR = Path("~/.testbed/slurm")  # where job plans go unless told: home directories are shared


class SlurmInventory(BaseModel):
    """`--inventory FILE` for Slurm: DC -> a feature or node names, and what salloc is given."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dcs: dict[str, str | list[str]] = {}
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    qos: str | None = None
    root: Root | None = None
    shared_dir: str | None = None


class SlurmOptions(BackendOptions):
    inventory: Path | None = None  # a SlurmInventory file
    dc_map: str | None = None  # east=FEATURE;west=NODE,NODE (default: each DC is the nodes with its name as feature)
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    qos: str | None = None
    root: Root = "auto"  # who shapes: the site's Prolog, sudo -n in the job, or whichever this site offers
    shared_dir: Path | None = None  # where the job plan goes: a directory every node reads (default ~/.testbed/slurm)
    job: str | None = None  # an allocation to use (default: $SLURM_JOB_ID; none: testbed asks for one)
    wait: float = 300.0  # seconds salloc may wait for the allocation


def _config_value(text: str, key: str) -> str:
    for line in text.splitlines():
        name, _, value = line.partition("=")
        if name.strip() == key:
            return value.strip()
    return ""


def resolve_address(address: str) -> str:
    """NodeAddr as an IP address (a host name is resolved here, as the nodes resolve each other)."""
    if is_address(address):
        return address
    import socket

    try:
        return socket.gethostbyname(address)
    except OSError:
        raise FabricError(f"NodeAddr {address}: cannot resolve it to an address") from None


class SlurmBackend(Backend[SlurmPlan]):
    name: ClassVar[str] = "slurm"
    summary: ClassVar[str] = "Slurm nodes"
    forks_ranks: ClassVar[bool] = True  # a fork server per node, one srun step each
    shared_clock: ClassVar[bool] = False  # each node its own clock
    shares_files: ClassVar[bool] = True  # the nodes share the file system the job plan is on
    emulated: ClassVar[bool] = False  # real nodes: a node's ranks share its GPUs
    Options = SlurmOptions
    State = SlurmState
    options: SlurmOptions

    def __init__(self, options: SlurmOptions | None = None, recorded: SlurmState | None = None) -> None:
        super().__init__(options)
        self.recorded = recorded
        self._settings = self._merged()
        self._root: str | None = recorded.root if recorded else None
        self._job: str | None = (recorded.job_id or None) if recorded else None
        self._prefix = "tb-"

    def _merged(self) -> SlurmOptions:
        """The options, with the inventory's values where an option was not given."""
        given = self.options
        if given.inventory is None:
            return given
        inventory = validate_data(SlurmInventory, yaml.safe_load(given.inventory.read_text()) or {}, given.inventory)
        mapping = ";".join(f"{dc}={value if isinstance(value, str) else ','.join(value)}"
                           for dc, value in inventory.dcs.items())
        data = given.model_dump()
        for key in ("partition", "account", "time", "qos", "shared_dir"):
            if data[key] is None and getattr(inventory, key) is not None:
                data[key] = getattr(inventory, key)
        if data["dc_map"] is None and mapping:
            data["dc_map"] = mapping
        if inventory.root and given.root == "auto":
            data["root"] = inventory.root
        return SlurmOptions(**data)

    @classmethod
    def from_state(cls, saved: FabricState) -> SlurmBackend:
        record = saved.backend_state
        assert isinstance(record, SlurmState)
        return cls(SlurmOptions(**record.options), record)

    @property
    def shared_dir(self) -> Path:
        return (self._settings.shared_dir or DEFAULT_SHARED_DIR).expanduser().resolve()

    def existing_job(self) -> str | None:
        return self._settings.job or os.environ.get("SLURM_JOB_ID") or None

    def plan(self, topology: Topology, shaper: str, prefix: str,
             overrides: dict[str, LinkParams] | None = None) -> SlurmPlan:
        """Which Slurm node plays which node, from what scontrol says of them (or the state file's record)."""
        self._prefix = prefix  # new_state names the plan file after it
        if topology.tcp.congestion_control:
            raise ValueError("tcp.congestion_control: Slurm nodes keep their own TCP (set "
                             "net.ipv4.tcp_congestion_control on them)")
        if self.recorded is not None and self.recorded.nodes:
            placed = [PlacedNode(**item) for item in self.recorded.nodes]
        else:
            placed = self._place(topology)
        job = JobPlan(prefix, shaper, topology.model_dump(mode="json", exclude_unset=False), placed,
                      {key: asdict(params) for key, params in (overrides or {}).items()},
                      self._job or "", self._root or "")
        return slurm_plan(job)

    def _place(self, topology: Topology) -> list[PlacedNode]:
        source = str(self._settings.inventory or "--dc-map")
        dc_map = parse_dc_map(self._settings.dc_map, source) if self._settings.dc_map else None
        nodes = parse_nodes(slurm(["scontrol", "show", "node", "-o"], what="scontrol show node"))
        within = None
        job = self.existing_job()
        if job:
            found = parse_job(slurm(["scontrol", "show", "job", "-o", job], what=f"job {job}"))
            within = tuple(slurm(["scontrol", "show", "hostnames", found.nodelist]).split())
        by_dc = assign(topology, nodes, dc_map, within, source)
        addresses = {node.name: node.address for node in nodes}
        out = []
        for dc in topology.dcs:
            for name, slurm_node in zip(dc.node_names(), by_dc[dc.name]):
                out.append(PlacedNode(name, dc.name, slurm_node, resolve_address(addresses[slurm_node])))
        return out

    def host_refusal(self, topology: Topology) -> str | None:
        """Nobody to shape the nodes (neither testbed's Prolog/Epilog nor sudo -n): one line, before any job."""
        try:
            self._root = self._choose_root()
        except FabricError as error:
            return str(error)
        return None

    def _choose_root(self) -> str:
        chosen = self._settings.root
        in_job = bool(self.existing_job())
        if chosen == "prolog" or chosen == "auto":
            config = slurm(["scontrol", "show", "config"], what="scontrol show config")
            prolog, epilog = _config_value(config, "Prolog"), _config_value(config, "Epilog")
            hooks = prolog not in ("", "(null)") and epilog not in ("", "(null)") and _may_be_ours(prolog)
            if chosen == "prolog":
                if in_job:
                    raise FabricError("--root prolog: the Prolog of this allocation has run already; use sudo -n "
                                      "(--root sudo) or let testbed ask for the allocation (unset SLURM_JOB_ID)")
                if not hooks:
                    raise FabricError("--root prolog: this cluster runs no Prolog/Epilog (scontrol show config); "
                                      "ask the admin to install `testbed slurm prolog|epilog`")
                return "prolog"
        if chosen == "sudo" or can_be_root():
            return "sudo"
        if chosen == "auto" and hooks and not in_job:
            return "prolog"
        raise FabricError("nobody can shape the nodes: no testbed Prolog/Epilog on this cluster "
                          "(`testbed slurm prolog|epilog`, installed by the admin) and no passwordless sudo "
                          "(`sudo -n`) for you")

    def new_state(self) -> SlurmState:
        root = self._root or self._choose_root()
        return SlurmState(options=self.options.model_dump(mode="json"), job_id=self.existing_job() or "",
                          submitted=False, root=root, plan_file=str(plan_path(self.shared_dir, self._prefix)))

    def make_fabric(self, prefix: str, topology: Topology, on_progress: Progress | None = None) -> SlurmFabric:
        return SlurmFabric(prefix, topology, self._settings, on_progress)


    @classmethod
    def clean(cls, prefix: str, saved: FabricState | None) -> list[str]:
        """Restore the nodes the state file records and end testbed's job; without a state file, end any job
        named after the prefix (its Epilog restores its nodes)."""
        if saved is not None and isinstance(saved.backend_state, SlurmState):
            backend = cls.from_state(saved)
            topology = saved.topology_spec()
            fabric = backend.make_fabric(prefix, topology)
            fabric.attach(backend.plan(topology, saved.shaper, prefix, saved.override_params()), saved)
            hosts = [f"{item['slurm']} (slurm)" for item in saved.backend_state.nodes]
            job = saved.backend_state.job_id
            fabric.down()
            return hosts + ([f"job {job} (slurm)"] if job and saved.backend_state.submitted else [])
        return clean_unrecorded(prefix, plan_path(DEFAULT_SHARED_DIR.expanduser(), prefix))


def _may_be_ours(prolog: str) -> bool:
    """Whether the cluster's Prolog may be testbed's: it names testbed, or it cannot be read from here."""
    try:
        return "testbed" in Path(prolog).read_text(errors="replace")
    except OSError:
        return True


def clean_unrecorded(prefix: str, plan_file: Path) -> list[str]:
    """Without a state file: end testbed's job of this prefix (its Epilog restores its nodes), and restore the
    nodes the job plan left in the shared directory names (a cleanup job of our own, where we can be root). No
    job plan: nothing to do, and no Slurm command is run (every backend's clean runs at every teardown)."""
    if not plan_file.exists():  # written before any job is asked for, removed at down: nothing was left
        return []
    removed = []
    job = find_job(prefix)
    if job:
        end_job(job)
        removed.append(f"job {job} (slurm)")
    try:
        plan = JobPlan.load(plan_file.read_text())
    except (OSError, ValueError, TypeError, KeyError):
        return removed
    nodes = [item.slurm for item in plan.nodes]
    if can_be_root():
        restore_by_job(prefix, nodes)
        removed += [f"{node} (slurm)" for node in nodes]
    plan_file.unlink(missing_ok=True)
    return removed


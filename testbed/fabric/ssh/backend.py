"""The ssh backend as the registry knows it: check the hosts, pick the shaper, plan with testbed.plan.hosts,
shape with SshFabric; cleaning restores the hosts the state file names (without it, there is nothing to find)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import model_validator

from testbed.fabric.backend import Backend, BackendOptions, Progress
from testbed.fabric.errors import FabricError
from testbed.fabric.ssh.checks import HostCheck, check_inventory
from testbed.fabric.ssh.fabric import SshFabric
from testbed.fabric.ssh.state import SshState
from testbed.fabric.state import FabricState
from testbed.plan.hosts import HostsPlan, build_hosts_plan
from testbed.spec.inventory import Inventory, load_inventory
from testbed.spec.link import LinkParams
from testbed.spec.topology import Topology


class SshOptions(BackendOptions):
    inventory: Path | None = None  # the inventory YAML file
    known_hosts: Path = Path("~/.ssh/known_hosts")  # host keys to verify against
    accept_new: bool = False  # record unknown host keys (a changed key is still refused)

    @model_validator(mode="after")
    def _inventory_given(self) -> SshOptions:
        if self.inventory is None:
            raise ValueError("--backend ssh needs --inventory FILE")
        return self


class HostsNotReady(FabricError):
    """Some hosts cannot run a testbed; `rows` is the full check table for the CLI to print."""

    def __init__(self, rows: list[HostCheck]) -> None:
        self.rows = rows
        bad = [f"{r.host}: {r.problems}" for r in rows if r.problems or not r.reachable]
        super().__init__(f"{len(bad)} host(s) not ready: " + "; ".join(bad))


def pick_shaper(requested: str, rows: list[HostCheck]) -> str:
    """auto: netem when every host has it, else the userspace delay line; an explicit netem is checked."""
    everywhere = all(r.netem == "yes" for r in rows)
    if requested == "auto":
        return "netem" if everywhere else "userspace-delay"
    if requested == "netem" and not everywhere:
        missing = ", ".join(r.host for r in rows if r.netem != "yes")
        raise FabricError(f"shaper netem requested but sch_netem is missing on {missing}; use --shaper auto")
    return requested


def _inventory_record(inventory: Inventory, source: Path) -> dict:
    """The inventory as data, key paths made absolute: the state must not depend on the file staying put."""
    data = inventory.model_dump(mode="json")
    for dc, hosts in inventory.dcs.items():
        for index, host in enumerate(hosts):
            data["dcs"][dc][index]["key"] = str(host.key_path(source.parent).resolve())
    return data


class SshBackend(Backend[HostsPlan]):
    name: ClassVar[str] = "ssh"
    summary: ClassVar[str] = "inventory hosts"
    forks_ranks: ClassVar[bool] = True  # a fork server per host
    shared_clock: ClassVar[bool] = False  # each host its own clock
    emulated: ClassVar[bool] = False  # real hosts: a host's ranks share its GPUs, and may use NVLink between them
    Options = SshOptions
    State = SshState
    options: SshOptions

    def __init__(self, options: SshOptions | None = None, inventory: Inventory | None = None) -> None:
        super().__init__(options)
        assert self.options.inventory is not None
        self.source = self.options.inventory.resolve()
        self.known_hosts = self.options.known_hosts.expanduser().resolve()
        self._inventory = inventory

    @classmethod
    def from_state(cls, saved: FabricState) -> SshBackend:
        """The hosts as recorded (the inventory with absolute key paths), not as the file may read now."""
        record = saved.backend_state
        assert isinstance(record, SshState)
        options = SshOptions(inventory=Path(record.inventory_file), known_hosts=Path(record.known_hosts),
                             accept_new=record.accept_new)
        return cls(options, Inventory(**record.inventory))

    @property
    def inventory(self) -> Inventory:
        if self._inventory is None:
            self._inventory = load_inventory(self.source)
        return self._inventory

    def plan(self, topology: Topology, shaper: str, prefix: str,
             overrides: dict[str, LinkParams] | None = None) -> HostsPlan:
        """`auto` shows as userspace-delay (what hosts without netem take). Real hosts keep their own TCP."""
        if topology.tcp.congestion_control:
            raise ValueError("tcp.congestion_control: real hosts keep their own TCP (set "
                             "net.ipv4.tcp_congestion_control on them; each run records what they run)")
        chosen = "userspace-delay" if shaper == "auto" else shaper
        return build_hosts_plan(topology, self.inventory, chosen, prefix, overrides, inventory_file=str(self.source))

    def resolve_shaper(self, requested: str, topology: Topology, on_progress: Progress | None = None) -> str:
        """Check every host first (python, torch, tc, netem); one that is not ready stops here."""
        if on_progress:
            on_progress(f"checking {len(self.inventory.hosts())} hosts over SSH")
        rows = check_inventory(self.inventory, self.source.parent, self.known_hosts, self.options.accept_new)
        if any(r.problems or not r.reachable for r in rows):
            raise HostsNotReady(rows)
        return pick_shaper(requested, rows)

    def new_state(self) -> SshState:
        return SshState(str(self.source), _inventory_record(self.inventory, self.source), str(self.known_hosts),
                        self.options.accept_new)

    def make_fabric(self, prefix: str, topology: Topology, on_progress: Progress | None = None) -> SshFabric:
        return SshFabric(prefix, topology, self.inventory, self.source, self.known_hosts, self.options.accept_new,
                         on_progress)

    @classmethod
    def clean(cls, prefix: str, saved: FabricState | None) -> list[str]:
        """Restore the hosts the state file records (processes, iptables rules, our qdisc, the workdir)."""
        if saved is None or not isinstance(saved.backend_state, SshState):
            return []
        backend = cls.from_state(saved)
        topology = saved.topology_spec()
        fabric = backend.make_fabric(prefix, topology)
        fabric.attach(backend.plan(topology, saved.shaper, prefix, saved.override_params()), saved)
        hosts = [f"{host} (ssh)" for host in saved.backend_state.hosts]
        fabric.down()
        return hosts

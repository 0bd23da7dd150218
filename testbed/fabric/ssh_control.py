"""Bring an ssh testbed up (check the hosts, pick the shaper, shape) and re-attach to one from its state."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from testbed.fabric import state as state_store
from testbed.fabric.base import FabricError
from testbed.fabric.ssh import SshFabric
from testbed.plan.hosts import build_hosts_plan
from testbed.plan.network import NetworkPlan
from testbed.remote.checks import HostCheck, check_inventory
from testbed.spec.inventory import Inventory, load_inventory
from testbed.spec.topology import Topology

if TYPE_CHECKING:
    from testbed.fabric.control import Backend, Testbed


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


def _inventory_record(inventory: Inventory, source: Path) -> dict[str, Any]:
    """The inventory as data, key paths made absolute: the state must not depend on the file staying put."""
    data = inventory.model_dump(mode="json")
    for dc, hosts in inventory.dcs.items():
        for index, host in enumerate(hosts):
            data["dcs"][dc][index]["key"] = str(host.key_path(source.parent).resolve())
    return data


def bring_up_hosts(topology: Topology, *, prefix: str, shaper: str, topology_file: str | Path | None,
                   on_progress: Callable[[str], None] | None, backend: "Backend") -> "Testbed":
    from testbed.fabric.control import Testbed, tear_down

    if backend.inventory is None:
        raise FabricError("--backend ssh needs --inventory FILE")
    source = backend.inventory.resolve()
    inventory = load_inventory(source)
    build_hosts_plan(topology, inventory, "userspace-delay", prefix, inventory_file=str(source))  # fails early
    known_hosts = backend.known_hosts.expanduser().resolve()
    if on_progress:
        on_progress(f"checking {len(inventory.hosts())} hosts over SSH")
    rows = check_inventory(inventory, source.parent, known_hosts, backend.accept_new)
    if any(r.problems or not r.reachable for r in rows):
        raise HostsNotReady(rows)
    resolved = pick_shaper(shaper, rows)
    if state_store.load(prefix) is not None:
        if on_progress:
            on_progress(f"restoring a previous testbed ({prefix})")
        tear_down(prefix)
    plan = build_hosts_plan(topology, inventory, resolved, prefix, inventory_file=str(source))
    state = state_store.FabricState(
        backend="ssh", prefix=prefix, shaper=resolved, topology=topology.model_dump(mode="json", exclude_unset=False),
        topology_file=str(topology_file) if topology_file else None,
        backend_state={"inventory_file": str(source), "inventory": _inventory_record(inventory, source),
                       "known_hosts": str(known_hosts), "accept_new": backend.accept_new, "hosts": {}})
    state_store.save(state)
    fabric = SshFabric(prefix, topology, inventory, source, known_hosts, backend.accept_new, on_progress)
    try:
        fabric.up(plan, state)
    except BaseException:
        if not state.backend_state.get("hosts"):  # every host restored: nothing left to undo
            state_store.remove(prefix)
        raise
    return Testbed(topology, plan.network, fabric, state)


def attach_hosts(topology: Topology, saved: state_store.FabricState) -> tuple[NetworkPlan, SshFabric]:
    record = saved.backend_state
    inventory = Inventory(**record["inventory"])
    source = Path(record["inventory_file"])
    plan = build_hosts_plan(topology, inventory, saved.shaper, saved.prefix, saved.override_params(), str(source))
    fabric = SshFabric(saved.prefix, topology, inventory, source, Path(record["known_hosts"]), record["accept_new"])
    fabric.attach(plan, saved)
    return plan.network, fabric

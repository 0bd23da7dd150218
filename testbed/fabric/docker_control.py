"""Bring a docker testbed up (or adopt the containers docker compose started) and re-attach from its state."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from testbed.fabric import state as state_store
from testbed.fabric.base import FabricError
from testbed.fabric.containers import DockerFabric, docker_network_plan
from testbed.plan.containers import build_containers_plan
from testbed.plan.network import NetworkPlan
from testbed.spec.topology import Topology

if TYPE_CHECKING:
    from testbed.fabric.control import Backend, Testbed


def bring_up_containers(topology: Topology, *, prefix: str, shaper: str, topology_file: str | Path | None,
                        on_progress: Callable[[str], None] | None, backend: "Backend") -> "Testbed":
    from testbed.fabric.control import Testbed, tear_down

    try:
        plan = build_containers_plan(topology, shaper, prefix)  # pure: fails before anything is created
    except ValueError as error:
        raise FabricError(f"{topology_file or topology.name}: {error}") from None
    fabric = DockerFabric(prefix, topology, backend.image, backend.adopt, on_progress)
    if not backend.adopt and state_store.load(prefix) is not None:
        if on_progress:
            on_progress(f"removing a previous testbed ({prefix})")
        tear_down(prefix)
    state = state_store.FabricState(
        backend="docker", prefix=prefix, shaper=shaper, topology=topology.model_dump(mode="json", exclude_unset=False),
        topology_file=str(topology_file) if topology_file else None,
        backend_state={"image": backend.image, "adopted": backend.adopt})
    state_store.save(state)  # first, so `clean` and a later `up` know about a half-built testbed
    try:
        if backend.adopt:
            fabric.adopt(plan, state)
        else:
            fabric.up(plan, state)
    except BaseException:
        state_store.remove(prefix)
        raise
    assert fabric.plan is not None
    return Testbed(topology, fabric.plan, fabric, state)


def attach_containers(topology: Topology, saved: state_store.FabricState) -> tuple[NetworkPlan, DockerFabric]:
    record = saved.backend_state
    plan = docker_network_plan(topology, saved.shaper, saved.prefix, saved.override_params())
    fabric = DockerFabric(saved.prefix, topology, record["image"], record.get("adopted", False))
    fabric.attach(plan, saved)
    return plan, fabric

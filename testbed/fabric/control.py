"""Glue between the CLI and a backend: bring up from a topology, re-attach from the state file, tear down."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from testbed.fabric import delayline
from testbed.fabric import state as state_store
from testbed.fabric.base import Fabric, FabricError
from testbed.fabric.kernel import resolve_shaper
from testbed.fabric.netns import NetnsFabric, clean, list_namespaces
from testbed.plan.network import LinkEnd, NetworkPlan, build_plan
from testbed.spec.topology import Topology, topology_from_data

BACKENDS = ("netns", "docker", "ssh")
DEFAULT_IMAGE = os.environ.get("TESTBED_IMAGE", "testbed:latest")


@dataclass(frozen=True)
class Backend:
    """Which backend builds the testbed; for ssh, how to reach the hosts; for docker, the image, and whether
    to adopt the containers docker compose started instead of creating them."""

    name: str = "netns"
    inventory: Path | None = None
    known_hosts: Path = Path("~/.ssh/known_hosts")
    accept_new: bool = False
    image: str = DEFAULT_IMAGE
    adopt: bool = False


@dataclass
class Testbed:
    """A running (or about to run) testbed: what it was built from, its plan and its backend."""

    topology: Topology
    plan: NetworkPlan
    fabric: Fabric
    state: state_store.FabricState

    def mechanism(self, end: LinkEnd) -> str:
        """Which mechanism shapes this link end, in words for tables and manifests."""
        shaping = end.shaping
        parts = [obj.kind for obj in shaping.tc if obj.what == "qdisc" and obj.kind != "pfifo"]
        if shaping.delay_line is not None:
            parts.append("delay-line" if self.fabric.delay_applied(end) else "delay NOT applied")
        if shaping.not_applied:
            parts.append(f"{'/'.join(shaping.not_applied)} NOT applied")
        return "+".join(parts) if parts else "unshaped"

    def describe(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "topology": plan.topology,
            "topology_file": self.state.topology_file,
            "backend": self.state.backend,
            "prefix": plan.prefix,
            "shaper": plan.shaper,
            "nodes": [{"name": n.name, "dc": n.dc, "namespace": n.ns, "address": n.address} for n in plan.nodes],
            "links": [{"key": end.key, "kind": end.kind, "namespace": end.ns, "interface": end.ifname,
                       **end.shaping.params.describe(), "shaper": plan.shaper, "mechanism": self.mechanism(end)}
                      for end in plan.link_ends],
            **self.fabric.status(),
        }


def bring_up(topology: Topology, *, prefix: str, shaper: str = "auto", topology_file: str | Path | None = None,
             on_progress: Callable[[str], None] | None = None, backend: Backend = Backend()) -> Testbed:
    """Clean any stale testbed with this prefix, then build `topology`. Nothing is left behind on failure."""
    if backend.name == "ssh":
        from testbed.fabric.ssh_control import bring_up_hosts

        return bring_up_hosts(topology, prefix=prefix, shaper=shaper, topology_file=topology_file,
                              on_progress=on_progress, backend=backend)
    if backend.name == "docker":
        from testbed.fabric.docker_control import bring_up_containers

        return bring_up_containers(topology, prefix=prefix, shaper=shaper, topology_file=topology_file,
                                   on_progress=on_progress, backend=backend)
    if backend.name != "netns":
        raise FabricError(f"--backend: expected one of {', '.join(BACKENDS)}, got {backend.name!r}")
    resolved = resolve_shaper(shaper)
    plan = build_plan(topology, resolved, prefix)  # pure: fails before anything is created
    if list_namespaces(prefix) or state_store.load(prefix) is not None:
        if on_progress:
            on_progress(f"removing a previous testbed ({prefix}*)")
        tear_down(prefix)
    state = state_store.FabricState(backend="netns", prefix=prefix, shaper=resolved,
                                    topology=topology.model_dump(mode="json", exclude_unset=False),
                                    topology_file=str(topology_file) if topology_file else None)
    fabric = NetnsFabric(prefix, on_progress=on_progress)
    state_store.save(state)  # first, so `clean` and a later `up` know about a half-built testbed
    try:
        fabric.up(plan, state)
    except BaseException:
        state_store.remove(prefix)
        raise
    return Testbed(topology, plan, fabric, state)


def attach(prefix: str) -> Testbed:
    """The testbed that `up` left running, rebuilt from the state file."""
    saved = state_store.load(prefix)
    if saved is None:
        raise FabricError(f"no testbed is up with prefix {prefix!r} (run `testbed up TOPOLOGY` first)")
    topology = _topology_from_state(saved)
    if saved.backend == "ssh":
        from testbed.fabric.ssh_control import attach_hosts

        plan, fabric = attach_hosts(topology, saved)
        return Testbed(topology, plan, fabric, saved)
    if saved.backend == "docker":
        from testbed.fabric.docker_control import attach_containers

        plan, fabric = attach_containers(topology, saved)
        return Testbed(topology, plan, fabric, saved)
    plan = build_plan(topology, saved.shaper, prefix, saved.override_params())
    fabric = NetnsFabric(prefix)
    fabric.attach(plan, saved)
    return Testbed(topology, plan, fabric, saved)


def _topology_from_state(saved: state_store.FabricState) -> Topology:
    data = dict(saved.topology)
    return topology_from_data(_to_units(data), saved.topology_file)


def _to_units(data: dict[str, Any]) -> dict[str, Any]:
    """model_dump gives SI floats; the spec reads bare numbers in base units, so they round-trip as is."""
    links = []
    for link in data.get("links", []):
        link = {key: value for key, value in link.items() if value is not None}
        if "distance" in link and "latency" in link:
            link.pop("latency")
        if isinstance(link.get("reverse"), dict):
            link["reverse"] = {k: v for k, v in link["reverse"].items() if v is not None}
            if "distance" in link["reverse"] and "latency" in link["reverse"]:
                link["reverse"].pop("latency")
        links.append(link)
    data["links"] = links
    return data


def tear_down(prefix: str) -> list[str]:
    """Remove everything with this prefix, with or without a state file: namespaces, and containers and
    networks labelled with it (not those docker compose started and a controller adopted: compose removes
    those). Hosts of an ssh testbed are restored from the recorded state; if one cannot be reached the state
    file stays for a later `clean`."""
    from testbed.fabric import containers

    removed: list[str] = []
    saved = state_store.load(prefix)
    if saved is not None and saved.backend == "ssh":
        testbed = attach(prefix)
        removed += [f"{host} (ssh)" for host in saved.backend_state.get("hosts", {})]
        testbed.fabric.down()
    adopted = saved is not None and saved.backend == "docker" and saved.backend_state.get("adopted")
    if not adopted and containers.engine_available():
        removed += containers.clean(prefix)
    removed += clean(prefix)
    state_store.remove(prefix)
    delayline.remove_files(prefix)
    return removed

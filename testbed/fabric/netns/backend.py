"""The netns backend as the registry knows it: plan with testbed.plan.network, build with NetnsFabric."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from testbed.agents.delayline.control import remove_files
from testbed.fabric.backend import Backend, Progress
from testbed.fabric.netns.fabric import NetnsFabric
from testbed.fabric.netns.kernel import resolve_shaper
from testbed.fabric.netns.namespaces import list_namespaces, remove
from testbed.fabric.netns.neighbours import release_neighbour_capacity
from testbed.fabric.state import BackendState, FabricState, state_dir
from testbed.plan.network import NetworkPlan, build_plan
from testbed.spec.link import LinkParams
from testbed.spec.topology import Topology


@dataclass
class NetnsState(BackendState):
    delay_lines: dict[str, int] = field(default_factory=dict)  # gateway namespace -> delay-line supervisor pid


class NetnsBackend(Backend[NetworkPlan]):
    name: ClassVar[str] = "netns"
    summary: ClassVar[str] = "namespaces on this machine"
    State = NetnsState
    forks_ranks: ClassVar[bool] = True
    shares_files: ClassVar[bool] = True

    def plan(self, topology: Topology, shaper: str, prefix: str,
             overrides: dict[str, LinkParams] | None = None) -> NetworkPlan:
        """`auto` shows as userspace-delay (what a kernel without netem takes)."""
        return build_plan(topology, "userspace-delay" if shaper == "auto" else shaper, prefix, overrides)

    def resolve_shaper(self, requested: str, topology: Topology, on_progress: Progress | None = None) -> str:
        return resolve_shaper(requested)

    def stale(self, prefix: str, saved: FabricState | None) -> bool:
        return saved is not None or bool(list_namespaces(prefix))

    def still_up(self, prefix: str, saved: FabricState | None) -> bool:
        return bool(list_namespaces(prefix))

    def make_fabric(self, prefix: str, topology: Topology, on_progress: Progress | None = None) -> NetnsFabric:
        return NetnsFabric(prefix, on_progress)

    @classmethod
    def clean(cls, prefix: str, saved: FabricState | None) -> list[str]:
        """Our namespaces (and their processes and interfaces) and the delay lines' files."""
        removed = remove(prefix)
        release_neighbour_capacity(prefix)
        remove_files(state_dir(), prefix)
        return removed

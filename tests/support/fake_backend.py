"""A backend that builds nothing, for the registry and the lifecycle written against it (tests only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from testbed.agents.tc import LinkCounters
from testbed.fabric.backend import Backend, BackendOptions
from testbed.fabric.base import Fabric
from testbed.fabric.errors import FabricError
from testbed.fabric.state import BackendState, FabricState, save, state_path
from testbed.plan.network import NetworkPlan, build_plan

LOG: list[tuple[str, ...]] = []  # what every fake backend was asked, in order


class FakeOptions(BackendOptions):
    size: int = 1
    fail: str = ""  # "up": the fabric's up raises; "up-leaving": raises with a change left to undo


@dataclass
class FakeState(BackendState):
    size: int = 1
    built: list[str] = field(default_factory=list)
    left: bool = False

    def holds_changes(self) -> bool:
        return self.left


class FakeFabric(Fabric):
    def __init__(self, prefix: str, fail: str) -> None:
        self.prefix, self.fail = prefix, fail
        self.plan: NetworkPlan | None = None
        self.state: FabricState | None = None

    def up(self, plan: NetworkPlan, state: FabricState) -> None:
        LOG.append(("up", self.prefix, str(state_path(self.prefix).exists())))
        self.plan, self.state = plan, state
        state.backend_state.built = [space.name for space in plan.namespaces]
        state.backend_state.left = self.fail == "up-leaving"
        save(state)  # as a real backend records what it changed, as it goes
        if self.fail:
            raise FabricError("injected failure")

    def attach(self, plan: NetworkPlan, state: FabricState) -> None:
        self.plan, self.state = plan, state

    def down(self) -> None:
        LOG.append(("down", self.prefix))

    def popen(self, node: str, argv: list[str], **kwargs: Any) -> Any:
        raise FabricError("nothing runs here")

    def shape(self, key: str, params: Any) -> None:
        import dataclasses

        from testbed.plan.shaping import plan_shaping

        assert self.plan is not None
        self.plan = dataclasses.replace(self.plan, link_ends=tuple(
            dataclasses.replace(e, shaping=plan_shaping(params, self.plan.shaper)) if e.key == key else e
            for e in self.plan.link_ends))

    def counters(self) -> dict[str, LinkCounters]:
        return {}

    def status(self) -> dict[str, Any]:
        return {"backend": "fake", "summary": "nothing"}

    def delay_applied(self, end: Any) -> bool:
        return True

    def dead_delay_lines(self) -> list[str]:
        return []


class FakeBackend(Backend):
    name: ClassVar[str] = "fake"
    summary: ClassVar[str] = "nothing at all"
    Options = FakeOptions
    State = FakeState
    options: FakeOptions

    @classmethod
    def from_state(cls, saved: FabricState) -> FakeBackend:
        assert isinstance(saved.backend_state, FakeState)
        return cls(FakeOptions(size=saved.backend_state.size))

    def plan(self, topology: Any, shaper: str, prefix: str, overrides: Any = None) -> NetworkPlan:
        if topology.name == "unplannable":
            raise ValueError("no layout fits")
        return build_plan(topology, "userspace-delay" if shaper == "auto" else shaper, prefix, overrides)

    def resolve_shaper(self, requested: str, topology: Any, on_progress: Any = None) -> str:
        LOG.append(("resolve", requested))
        return "netem" if requested == "auto" else requested

    def new_state(self) -> FakeState:
        return FakeState(self.options.size)

    def make_fabric(self, prefix: str, topology: Any, on_progress: Any = None) -> FakeFabric:
        return FakeFabric(prefix, self.options.fail)

    @classmethod
    def clean(cls, prefix: str, saved: FabricState | None) -> list[str]:
        LOG.append(("clean", cls.name, prefix, type(saved.backend_state).__name__ if saved else "-"))
        return [f"{cls.name}:{prefix}"]


class OtherOptions(BackendOptions):
    colour: str = "blue"


class OtherBackend(FakeBackend):
    name: ClassVar[str] = "other"
    Options = OtherOptions

    def make_fabric(self, prefix: str, topology: Any, on_progress: Any = None) -> FakeFabric:
        return FakeFabric(prefix, "")

    def new_state(self) -> FakeState:
        return FakeState()


class Misnamed(FakeBackend):
    name: ClassVar[str] = "something-else"

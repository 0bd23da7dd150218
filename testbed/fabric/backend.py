"""What every backend package exports: one class naming the backend, its command-line options (a model), how it
plans a topology, makes a fabric and cleans up after itself (Kathará's IManager: one abstract interface, one
package per backend). testbed.fabric.lifecycle brings a testbed up, re-attaches and tears down once, against
this; testbed.fabric.registry turns a name into the class.

The seam: `Backend[PlanT]` plans a topology into a PlanT (a testbed.plan.view.TestbedView subclass, pure data:
the view every reader shares plus this backend's own layout) and makes a `Fabric[PlanT]` that builds it. A new
backend: a package testbed/fabric/<name>/ with its plan type (a TestbedView subclass; in testbed/plan/ when an
agent must read it, as the docker router reads RouterConfig), a Backend[ItsPlan] subclass and a Fabric[ItsPlan],
one line in testbed.fabric.registry, and tests under tests/fabric/<name>/ with the marker of what they need."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar, Generic, Self

from pydantic import BaseModel, ConfigDict

from testbed.fabric.base import Fabric, PlanT
from testbed.fabric.state import BackendState, FabricState
from testbed.spec.link import LinkParams
from testbed.spec.topology import Topology

Progress = Callable[[str], None]


class BackendOptions(BaseModel):
    """A backend's command-line options (`--image`, `--inventory` ...), validated; this one has none. An option
    that a backend does not take is refused (extra keys are an error)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Backend(ABC, Generic[PlanT]):
    """One way to build a testbed: namespaces here, containers, real hosts. `Backend[PlanT]`: its plan() gives a
    PlanT and its make_fabric() a Fabric[PlanT] that brings that plan up."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line for --help
    Options: ClassVar[type[BackendOptions]] = BackendOptions
    State: ClassVar[type[BackendState]] = BackendState  # its record in the state file
    forks_ranks: ClassVar[bool] = False  # its fabric's fork_server() gives one (the fork launcher works here)
    shared_clock: ClassVar[bool] = True  # every node reads one clock (timestamps of different nodes compare)
    # every rank reads and writes this machine's file system (a restart's ranks find rank 0's checkpoint; elsewhere
    # every rank keeps its own on its node)
    shares_files: ClassVar[bool] = False
    # every node is emulated on this machine: its ranks share its GPUs, and their traffic must take the emulated
    # links (testbed.runner.ranks.rank_layout); real hosts (ssh) are not
    emulated: ClassVar[bool] = True

    def __init__(self, options: BackendOptions | None = None) -> None:
        self.options = options if options is not None else self.Options()

    @classmethod
    def from_state(cls, saved: FabricState) -> Self:
        """The backend as it was when it brought up the testbed `saved` records."""
        return cls()

    @abstractmethod
    def plan(self, topology: Topology, shaper: str, prefix: str,
             overrides: dict[str, LinkParams] | None = None) -> PlanT:
        """Pure: what `up` builds (what `up --dry-run` prints). `shaper` may be "auto": each backend says what
        it shows for it. Fails (SpecError, ValueError) before anything is probed or created."""

    def resolve_shaper(self, requested: str, topology: Topology, on_progress: Progress | None = None) -> str:
        """The shaper `requested` stands for here ("auto": netem where every kernel has it); an explicit one
        is checked. It may probe a kernel or the hosts."""
        return requested

    def host_refusal(self, topology: Topology) -> str | None:
        """Why this machine cannot build `topology` as asked, beyond its layout (None: it can): an emulated
        backend's nodes run on this host's kernel, which must let them pick the topology's congestion control.
        Read before anything is created."""
        from testbed.fabric.tcp import congestion_control_refusal

        chosen = topology.tcp.congestion_control
        if not self.emulated or not chosen:
            return None
        why = congestion_control_refusal(chosen)
        return f"tcp.congestion_control: {why}" if why else None

    def stale(self, prefix: str, saved: FabricState | None) -> bool:
        """Whether an earlier testbed with this prefix must be torn down before this one comes up."""
        return saved is not None

    def still_up(self, prefix: str, saved: FabricState | None) -> bool:
        """Whether what an earlier testbed with this prefix built is still there (a state file of a backend that
        cannot look without reaching its hosts counts as there)."""
        return self.stale(prefix, saved)

    def new_state(self) -> BackendState:
        """This backend's record for the state file of a testbed it is about to bring up."""
        return self.State()

    @abstractmethod
    def make_fabric(self, prefix: str, topology: Topology, on_progress: Progress | None = None) -> Fabric[PlanT]:
        """The fabric that will bring a plan up (or attach to one that is up)."""

    @classmethod
    @abstractmethod
    def clean(cls, prefix: str, saved: FabricState | None) -> list[str]:
        """Remove everything of this backend carrying `prefix`, with or without a state file (after a crash or
        SIGKILL); `saved` is the state file when this backend brought the testbed up. What was removed, in words.
        Every registered backend is asked (Mininet's cleanup callbacks)."""

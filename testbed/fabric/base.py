"""The one interface every backend's fabric offers to the CLI, runner and probe, generic in its backend's plan
(testbed.plan.view: every plan is a TestbedView)."""

from __future__ import annotations

import subprocess
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from testbed.plan.view import TestbedView

PlanT = TypeVar("PlanT", bound=TestbedView)

if TYPE_CHECKING:
    from testbed.agents.tc import LinkCounters
    from testbed.fabric.forkserver import Forks
    from testbed.fabric.state import FabricState
    from testbed.plan.view import LinkEnd
    from testbed.spec.link import LinkParams


class Fabric(ABC, Generic[PlanT]):
    """Bring a plan up, run things in its nodes, change links live, read counters, take it down.

    `Fabric[PlanT]` builds plans of type PlanT (a TestbedView subclass: NetworkPlan, ContainersPlan, HostsPlan
    ...). `plan` is the testbed as it stands (None before up/attach): the runner, probe and reports read only its
    view fields (nodes, addresses, link ends), kept true to what is applied as links are re-shaped."""

    plan: PlanT | None
    link_faults: ClassVar[bool] = False  # whether impair() can drop, delay or throttle a link on demand
    node_shells: ClassVar[bool] = False  # whether node_script() writes to a shell kept open on each node
    # whether a node's own kernel delays what it receives (a userspace delay line on the receiving node, in its
    # PREROUTING): its receive time then predates the delay, and a probe times round trips in user space
    delays_on_nodes: ClassVar[bool] = False

    @abstractmethod
    def up(self, plan: PlanT, state: FabricState) -> None:
        """Build `plan` (what the backend's plan() returned); on failure leave nothing behind and raise."""

    @abstractmethod
    def attach(self, plan: PlanT, state: FabricState) -> None:
        """Adopt a testbed that an earlier process brought up (from the state file)."""

    @abstractmethod
    def down(self) -> None: ...

    @abstractmethod
    def popen(self, node: str, argv: list[str], **kwargs: Any) -> subprocess.Popen: ...

    def exec(self, node: str, argv: list[str]) -> int:
        """Run argv in `node` in the foreground (`testbed exec`); its exit status (a backend may exec it in
        place and never return)."""
        return self.popen(node, argv, env={}).wait()

    @abstractmethod
    def shape(self, key: str, params: LinkParams) -> None: ...

    def impair(self, key: str, params: LinkParams) -> None:
        """Give direction `key` a fault's parameters live (testbed.plan.faults.impaired: a partition is loss
        100 % on the link end), or its own again when the fault clears. A backend that cannot says so."""
        from testbed.fabric.errors import NotSupported

        raise NotSupported(f"link faults are not supported by {type(self).__name__}")

    def prepare_link_faults(self) -> None:
        """Whatever a first link change would pay once (connections, lookups), paid now: before a fault's clock
        starts, so that its applied_at measures the change itself."""
        return

    def release_link_faults(self) -> None:
        """Give back what prepare_link_faults kept open (the faults are over)."""
        return

    def prepare_rank_faults(self, nodes: list[str]) -> None:
        """What a first signal to a rank on each of `nodes` would pay once (a session there), paid now: before a
        fault's clock starts, so that a scheduled kill's or straggler's applied_at measures the signal itself."""
        return

    def node_script(self, node: str, lines: list[str], timeout: float = 30.0) -> tuple[int, str]:
        """Run shell `lines` (set -e, in a subshell of it) in the shell kept open on `node` (the one
        prepare_rank_faults opens; opened now if it is not), where no new session is paid: (exit code, stdout and
        stderr together). What the script starts in the background outlives it; the shell exits when its channel
        closes. Only where node_shells says so (a backend whose commands start as local forks keeps none)."""
        from testbed.fabric.errors import NotSupported

        raise NotSupported(f"no shell is kept open on the nodes of {type(self).__name__}")

    def impair_all(self, changes: dict[str, LinkParams]) -> None:
        """impair() of several directions at once (a partition: both); a backend may change them in parallel."""
        for key, params in changes.items():
            self.impair(key, params)

    @abstractmethod
    def counters(self) -> dict[str, LinkCounters]: ...

    @abstractmethod
    def status(self) -> dict[str, Any]: ...

    @abstractmethod
    def delay_applied(self, end: LinkEnd) -> bool:
        """Whether a link end's latency/jitter/loss is applied right now (netem, or a live delay line)."""

    @abstractmethod
    def dead_delay_lines(self) -> list[str]:
        """Where a planned delay mechanism is not running (its links are dark): runs must fail on these."""

    def not_applied_reason(self) -> str:
        """Why what plan.not_applied() lists is not applied, in words."""
        return "no netem on this kernel; the userspace delay line serves inter-DC links only"

    def fork_server(self, preload: str, log: Path, env: dict[str, str]) -> Forks | None:
        """A process (netns), or one per container or host (docker, ssh), that imports `preload` once and forks
        commands into this fabric's nodes (testbed.agents.forkserver); None where every command is exec'd. It may
        still be importing when this returns: its ready() waits for it, and so does its first spawn."""
        return None

    def fetch_outputs(self, local: Path) -> None:
        """Bring back what nodes wrote into TESTBED_METRICS_DIR=`local` (remote backends; local ones share it)."""
        return

    def delay_line_stats(self) -> dict[str, dict]:
        """Direction key -> the userspace delay line's cumulative release figures, {worker, released, late:
        {bucket: packets}} (testbed.agents.delayline); empty where none runs (netem keeps no such figure)."""
        return {}


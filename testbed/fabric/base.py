"""The one interface every backend (netns, docker, ssh) offers to the CLI, runner and probe."""

from __future__ import annotations

import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.spec.link import LinkParams


class FabricError(RuntimeError):
    """A fabric operation that failed; str() is one line for the user."""


@dataclass(frozen=True)
class LinkCounters:
    """Kernel counters of one shaped egress interface."""

    tx_bytes: int
    tx_packets: int
    rx_bytes: int
    rx_packets: int
    qdisc_drops: int


class Fabric(ABC):
    """Bring a plan up, run things in its nodes, change links live, read counters, take it down."""

    @abstractmethod
    def up(self, plan: Any, state: Any = None) -> None:
        """Build `plan` (a NetworkPlan, or a HostsPlan for ssh); on failure leave nothing behind and raise."""

    @abstractmethod
    def down(self) -> None: ...

    @abstractmethod
    def popen(self, node: str, argv: list[str], **kwargs: Any) -> subprocess.Popen: ...

    @abstractmethod
    def shape(self, key: str, params: LinkParams) -> None: ...

    @abstractmethod
    def counters(self) -> dict[str, LinkCounters]: ...

    @abstractmethod
    def status(self) -> dict[str, Any]: ...

    @abstractmethod
    def attach(self, plan: Any, state: Any) -> None:
        """Adopt a testbed that an earlier process brought up (from the state file)."""

    @abstractmethod
    def delay_applied(self, end: Any) -> bool:
        """Whether a link end's latency/jitter/loss is applied right now (netem, or a live delay line)."""

    def fetch_outputs(self, local: Path) -> None:
        """Bring back what nodes wrote into TESTBED_METRICS_DIR=`local` (remote backends; local ones share it)."""

    def delay_line_stats(self) -> dict[str, dict]:
        """Direction key -> the userspace delay line's cumulative release figures, {worker, released, late:
        {bucket: packets}} (testbed.fabric.delayline); empty where none runs (netem keeps no such figure)."""
        return {}

    @abstractmethod
    def dead_delay_lines(self) -> list[str]:
        """Where a planned delay mechanism is not running (its links are dark): runs must fail on these."""

"""What the controller records of an ssh testbed: how to reach the hosts again, and every change it made on
each host, written before the change runs (so `down` and `clean` can undo a crash half-way)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from testbed.fabric.state import BackendState


@dataclass
class HostRecord:
    """One host that testbed touched: where it works, what it found and what it changed."""

    workdir: str
    interface: str
    root_qdisc_before: str
    changed: list[list[str]] = field(default_factory=list)  # argv lists, in the order they ran
    delay_line_pid: int | None = None  # the delay-line supervisor started there
    memory_dir: str = ""  # its delay-line files, in memory (plan.hosts.memory_dir), when not in the workdir


@dataclass
class SshState(BackendState):
    inventory_file: str = ""
    inventory: dict[str, Any] = field(default_factory=dict)  # the Inventory as data, key paths absolute
    known_hosts: str = ""
    accept_new: bool = False
    hosts: dict[str, HostRecord] = field(default_factory=dict)  # host name -> its record; gone once restored

    def holds_changes(self) -> bool:
        return bool(self.hosts)

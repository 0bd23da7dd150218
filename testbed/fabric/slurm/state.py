"""What the controller records of a Slurm testbed: the job (submitted by testbed or found), how root shapes the
nodes, where the job plan lives and which nodes were shaped, written before each change so that `down` and
`clean` undo a crash half-way."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from testbed.fabric.state import BackendState


@dataclass
class SlurmState(BackendState):
    options: dict[str, Any] = field(default_factory=dict)  # SlurmOptions as given (JSON)
    job_id: str = ""
    submitted: bool = False  # testbed asked for the allocation (and ends it on down)
    root: str = ""  # "prolog" | "sudo": who shapes the nodes
    plan_file: str = ""
    nodes: list[dict[str, Any]] = field(default_factory=list)  # PlacedNode records, interfaces once known
    shaped: list[str] = field(default_factory=list)  # Slurm nodes whose shaping may be in place

    def holds_changes(self) -> bool:
        return bool(self.job_id and self.submitted) or bool(self.shaped)

"""What is up, kept on disk so that status/shape/down/clean work from any later process."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.atomic import write_text

if TYPE_CHECKING:
    from testbed.spec.link import LinkParams

STATE_DIR_ENV = "TESTBED_STATE_DIR"
DEFAULT_STATE_DIR = "/run/testbed"


def state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV, DEFAULT_STATE_DIR))


@dataclass
class FabricState:
    """The inputs the plan was built from (the plan itself is rebuilt: it is a pure function of these)."""

    backend: str
    prefix: str
    shaper: str
    topology: dict[str, Any]
    topology_file: str | None = None
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)  # direction key -> LinkParams
    delay_lines: dict[str, int] = field(default_factory=dict)  # gateway namespace -> pid
    backend_state: dict[str, Any] = field(default_factory=dict)  # ssh: inventory, and what changed per host

    def override_params(self) -> dict[str, "LinkParams"]:
        from testbed.spec.link import LinkParams

        return {key: LinkParams(**value) for key, value in self.overrides.items()}

    def set_override(self, key: str, params: "LinkParams") -> None:
        self.overrides[key] = asdict(params)


def state_path(prefix: str) -> Path:
    return state_dir() / f"{prefix.rstrip('-') or 'testbed'}.json"


def save(state: FabricState) -> None:
    """Write atomically: a crash never leaves half a state file."""
    write_text(state_path(state.prefix), json.dumps(asdict(state), indent=1))


def load(prefix: str) -> FabricState | None:
    path = state_path(prefix)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return FabricState(**data)


def remove(prefix: str) -> None:
    try:
        state_path(prefix).unlink()
    except FileNotFoundError:
        pass

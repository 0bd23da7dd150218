"""What is up, kept on disk so that status/shape/down/clean work from any later process.

The plan itself is not stored: it is a pure function of the inputs kept here. Each backend keeps its own part
(`backend_state`, a dataclass of the backend's: its `State`), written as JSON and read back into that class."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from testbed import settings
from testbed.atomic import write_text
from testbed.fabric import registry
from testbed.fabric.errors import FabricError
from testbed.spec.link import LinkParams
from testbed.spec.topology import Topology, topology_from_data

STATE_DIR_ENV = settings.STATE_DIR
RUNTIME_ROOTS = ("/run", "/dev/shm")  # the first that is in memory holds the state (/run, where none is)
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")


def mount_type(path: str, mounts: str | None = None) -> str | None:
    """The file system type of the mount that holds `path` (the longest mount point above it in /proc/self/mounts,
    or in `mounts`, that file's text)."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    best, kind = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def runtime_root(mounts: str | None = None) -> Path:
    """Where files written on a timing path belong: /run where it is in memory (most Linux hosts), else /dev/shm.
    A fault is recorded in the state file before the link changes and the netns backend's delay lines read their
    configuration from there; on this microVM's ext4 /run one such write took up to 0.26 s while another process
    wrote to the disk, and faults fell due 0.27-0.40 s late (2026-11-27)."""
    for root in RUNTIME_ROOTS:
        if mount_type(root, mounts) in MEMORY_FILESYSTEMS:
            return Path(root)
    return Path(RUNTIME_ROOTS[0])


def state_dir() -> Path:
    """Where state files (and the netns backend's delay-line files) live: $TESTBED_STATE_DIR, else testbed/ in
    runtime_root() (/run/testbed on most hosts)."""
    return Path(os.environ.get(STATE_DIR_ENV) or runtime_root() / "testbed")


@dataclass
class BackendState:
    """A backend's own record in the state file; this one holds nothing."""

    def holds_changes(self) -> bool:
        """Whether something it changed is still to be undone after a failed bring-up (then the state file
        stays, for `clean`): nothing, unless a backend says so."""
        return False


@dataclass
class FabricState:
    """The inputs the plan was built from, and the backend's own record."""

    backend: str
    prefix: str
    shaper: str
    topology: dict[str, Any]
    topology_file: str | None = None
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)  # direction key -> LinkParams
    backend_state: BackendState = field(default_factory=BackendState)
    # link faults in force, in the order applied: fault id -> direction key -> {"original", "impaired"} (LinkParams
    # fields), written before the change is made, so that a later process can restore the link exactly
    faults: dict[str, dict[str, dict[str, dict[str, Any]]]] = field(default_factory=dict)
    # who brought it up and when (testbed.fabric.ownership.command_line, UTC ISO 8601), and whether it was left up
    # for a person (`testbed up`): a later bring-up of the same prefix refuses to replace a kept one
    created: str | None = None
    command: str | None = None
    kept: bool = False
    pid: int | None = None  # the process that brought it up, and its start (testbed.fabric.ownership.Owner)
    pid_start: int | None = None

    def describe_origin(self) -> str:
        """`topology two-dc (topologies/two-dc.yaml), brought up 2026-12-01 21:40:12 UTC by testbed up ...`."""
        name = self.topology.get("name", "?")
        where = f" ({self.topology_file})" if self.topology_file else ""
        when = (self.created or "at an unknown time").replace("T", " ").removesuffix("+00:00")
        when = f"{when} UTC" if self.created else when
        by = f" by `{self.command}`" if self.command else ""
        return f"topology {name}{where}, brought up {when}{by}"

    def override_params(self) -> dict[str, LinkParams]:
        return {key: LinkParams(**value) for key, value in self.overrides.items()}

    def applied_params(self) -> dict[str, LinkParams]:
        """What the links carry now: the overrides, and over them every fault in force (the latest applied wins)."""
        applied = self.override_params()
        for record in self.faults.values():
            applied.update({key: LinkParams(**entry["impaired"]) for key, entry in record.items()})
        return applied

    def set_override(self, key: str, params: LinkParams) -> None:
        self.overrides[key] = asdict(params)

    def topology_spec(self) -> Topology:
        """The topology as it was brought up, validated again (model_dump gave SI floats, which the spec reads
        as base units: they round-trip as they are)."""
        links = []
        for link in self.topology.get("links", []):
            link = {key: value for key, value in link.items() if value is not None}
            if "distance" in link and "latency" in link:
                link.pop("latency")
            if isinstance(link.get("reverse"), dict):
                link["reverse"] = {k: v for k, v in link["reverse"].items() if v is not None}
                if "distance" in link["reverse"] and "latency" in link["reverse"]:
                    link["reverse"].pop("latency")
            links.append(link)
        return topology_from_data({**self.topology, "links": links}, self.topology_file, si=True)


def state_path(prefix: str) -> Path:
    return state_dir() / f"{prefix.rstrip('-') or 'testbed'}.json"


def save(state: FabricState) -> None:
    """Write atomically: a crash never leaves half a state file."""
    write_text(state_path(state.prefix), json.dumps(asdict(state), indent=1))


def load(prefix: str) -> FabricState | None:
    """The state file of `prefix`, its backend's record read into that backend's State; None when there is none
    (or it cannot be read: `clean` needs no state)."""
    try:
        data = json.loads(state_path(prefix).read_text())
        kind = registry.get(data["backend"]).State
        data["backend_state"] = TypeAdapter(kind).validate_python(data.get("backend_state") or {})
        return FabricState(**data)
    except (OSError, ValueError, TypeError, KeyError, ValidationError, FabricError):
        return None


def remove(prefix: str) -> None:
    state_path(prefix).unlink(missing_ok=True)

"""The inventory file: the real hosts of each DC, how to reach them over SSH, and their inter-DC interface."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from testbed.spec.loader import load_model
from testbed.spec.topology import NAME_PATTERN


class HostSpec(BaseModel):
    """One host: SSH address and user, key file (key authentication only), inter-DC interface."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    address: str
    port: int = Field(22, ge=1, le=65535)
    user: str = Field(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    key: str  # private key file
    interface: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,15}$")  # the interface carrying inter-DC traffic
    sudo: bool = False
    python: str = Field("python3", pattern=r"^[A-Za-z0-9_./+-]+$")
    workdir: str = Field("/tmp/testbed", pattern=r"^/[A-Za-z0-9_./-]*$")  # testbed's files on the host live below

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError(f"expected an IP address, got {value!r}") from None

    def key_path(self, base: Path) -> Path:
        path = Path(self.key).expanduser()
        return path if path.is_absolute() else base / path


class Inventory(BaseModel):
    """dcs: DC name -> its hosts, in rank order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dcs: dict[str, list[HostSpec]] = Field(min_length=1)

    @model_validator(mode="after")
    def _names(self) -> Inventory:
        import re

        seen: set[str] = set()
        for dc, hosts in self.dcs.items():
            if not re.match(NAME_PATTERN, dc):
                raise ValueError(f"dcs.{dc}: DC names are lowercase letters, digits and _ (at most 12)")
            if not hosts:
                raise ValueError(f"dcs.{dc}: list at least one host")
            for index, host in enumerate(hosts):
                if host.name in seen:
                    raise ValueError(f"dcs.{dc}[{index}].name: duplicate host name {host.name!r}")
                seen.add(host.name)
        return self

    def hosts(self) -> list[tuple[str, HostSpec]]:
        return [(dc, host) for dc, hosts in self.dcs.items() for host in hosts]


def load_inventory(path: str | Path) -> Inventory:
    """Load an inventory file; raises SpecError (one line naming file and field) when unusable."""
    return load_model(Inventory, path)

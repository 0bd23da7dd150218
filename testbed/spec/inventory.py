"""The inventory file: the real hosts of each DC, how to reach them over SSH, and their inter-DC interface."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from testbed.spec.errors import named_pattern
from testbed.spec.loader import load_model
from testbed.spec.topology import NAME_PATTERN


class HostSpec(BaseModel):
    """One host: SSH address and user, key file (key authentication only), inter-DC interface."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=named_pattern(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$", "a host name: a letter or digit, "
                                            "then up to 62 letters, digits, _, . or -"))
    address: str
    port: int = Field(22, ge=1, le=65535)
    user: str = Field(pattern=named_pattern(r"^[a-z_][a-z0-9_-]{0,31}$", "a user name: a lowercase letter or _, "
                                            "then up to 31 lowercase letters, digits, _ or -"))
    key: str  # private key file
    interface: str = Field(pattern=named_pattern(r"^[A-Za-z0-9_.:-]{1,15}$", "an interface name: 1 to 15 letters, "
                                                 "digits, _, ., : or -"))  # the interface carrying inter-DC traffic
    sudo: bool = False
    python: str = Field("python3", pattern=named_pattern(r"^[A-Za-z0-9_./+-]+$", "a command or path of letters, "
                                                         "digits, _, ., /, + or -"))
    workdir: str = Field("/tmp/testbed", pattern=named_pattern(r"^/[A-Za-z0-9_./-]*$", "an absolute path of "
                                                               "letters, digits, _, ., / or -"))  # testbed's files on the host live below

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

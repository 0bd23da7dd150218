"""The topology file: data centers, nodes per DC, intra-DC access links and the inter-DC link matrix."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from testbed.spec import units
from testbed.spec.errors import did_you_mean, named_pattern
from testbed.spec.link import LinkParams, ReverseOverrides, _LinkFields, check_link, unit_field
from testbed.spec.loader import load_model, validate_data
from testbed.spec.subnet import lan_prefixlen

DEFAULT_SUBNET = "198.18.0.0/15"  # RFC 2544 benchmarking range
NAME_PATTERN = named_pattern(  # short: interface names hold "to-<dc>" in 15 bytes
    r"^[a-z][a-z0-9_]{0,11}$", "a DC name: a lowercase letter, then up to 11 lowercase letters, digits or _ "
    "(it goes into interface names of 15 characters), e.g. east")
FILE_NAME_PATTERN = named_pattern(
    r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", "a letter or digit, then up to 63 letters, digits, _, . or - "
    "(it names files and directories), e.g. two-dc")


class IntraSpec(BaseModel):
    """Each node's access link to its DC switch, both directions. Default: unshaped, no added latency."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bandwidth: float | None = None
    latency: float = 0.0

    _rate = unit_field(units.parse_rate, "bandwidth")
    _duration = unit_field(units.parse_delay, "latency")

    def params(self) -> LinkParams:
        return LinkParams(latency=self.latency, bandwidth=self.bandwidth)


class DCSpec(BaseModel):
    """One data center: a name and how many nodes it holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN)
    nodes: int = Field(ge=1, le=1000)
    intra: IntraSpec = IntraSpec()

    def node_names(self) -> list[str]:
        return [f"{self.name}-{index}" for index in range(self.nodes)]


class LinkSpec(_LinkFields):
    """One inter-DC link: `between` two DCs, forward parameters, optional `reverse` overrides."""

    between: tuple[str, str]
    reverse: ReverseOverrides | None = None

    @model_validator(mode="after")
    def _one_delay_source(self) -> LinkSpec:
        self._check_latency_or_distance()
        if self.reverse is not None:
            self.reverse._check_latency_or_distance()
        if self.between[0] == self.between[1]:
            raise ValueError(f"a link needs two different DCs, got {list(self.between)}")
        for prefix, params in (("", self.forward()), ("reverse.", self.backward())):
            problem = check_link(params)
            if problem is not None:
                raise ValueError(f"{prefix}{problem[0]}: {problem[1]}")
        return self

    def forward(self) -> LinkParams:
        """Parameters from between[0] to between[1]."""
        return self.overlay(LinkParams())

    def backward(self) -> LinkParams:
        """Parameters from between[1] to between[0]: forward with `reverse` applied."""
        forward = self.forward()
        return self.reverse.overlay(forward) if self.reverse is not None else forward


class TcpSpec(BaseModel):
    """The TCP every emulated node runs (unset: the host's, which a namespace or container takes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # a name from the kernel's net.ipv4.tcp_available_congestion_control: cubic (Linux's default), bbr, reno, ...
    congestion_control: str | None = Field(default=None, pattern=named_pattern(
        r"^[a-z][a-z0-9_]{0,15}$", "a congestion control's name as the kernel lists it, e.g. cubic or bbr"))


class Topology(BaseModel):
    """A whole topology file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=FILE_NAME_PATTERN)
    subnet: str = DEFAULT_SUBNET
    dcs: list[DCSpec] = Field(min_length=1)
    links: list[LinkSpec] = []
    tcp: TcpSpec = TcpSpec()

    @field_validator("subnet")
    @classmethod
    def _subnet(cls, value: str) -> str:
        try:
            network = ipaddress.IPv4Network(value, strict=True)
        except ValueError as error:
            raise ValueError(f"expected an IPv4 network such as '198.18.0.0/15' ({error})") from None
        return str(network)

    @model_validator(mode="after")
    def _consistent(self) -> Topology:
        names = [dc.name for dc in self.dcs]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise ValueError(f"dcs[{index}].name: duplicate DC name {name!r}")
        pairs: set[frozenset[str]] = set()
        for index, link in enumerate(self.links):
            for end in link.between:
                if end not in names:
                    raise ValueError(f"links[{index}].between: unknown DC {end!r}{did_you_mean(end, names)} "
                                     f"(DCs: {', '.join(names)})")
            pair = frozenset(link.between)
            if pair in pairs:
                raise ValueError(f"links[{index}].between: a second link between {link.between[0]} and "
                                 f"{link.between[1]}")
            pairs.add(pair)
        self._check_connected(names)
        try:
            lan_prefixlen(ipaddress.IPv4Network(self.subnet), len(self.dcs), max(dc.nodes for dc in self.dcs),
                          len(self.links))
        except ValueError as error:
            raise ValueError(f"subnet: {error}") from None
        return self

    def _check_connected(self, names: list[str]) -> None:
        neighbours: dict[str, set[str]] = {name: set() for name in names}
        for link in self.links:
            a, b = link.between
            neighbours[a].add(b)
            neighbours[b].add(a)
        seen, todo = {names[0]}, [names[0]]
        while todo:
            for peer in neighbours[todo.pop()] - seen:
                seen.add(peer)
                todo.append(peer)
        missing = [name for name in names if name not in seen]
        if missing:
            raise ValueError(f"links: DC {missing[0]!r} cannot be reached from {names[0]!r} over any link")

    def unusual(self) -> list[tuple[str, str]]:
        """(field, why) of each legal but unusual value: a one-way delay beyond what terrestrial paths have."""
        found = []
        for index, link in enumerate(self.links):
            for field, params in (("", link.forward()), ("reverse.", link.backward())):
                why = units.unusual_delay(params.latency)
                if why is not None and (field == "" or params.latency != link.forward().latency):
                    written = "distance" if (link.reverse if field else link).distance is not None else "latency"
                    found.append((f"links[{index}].{field}{written}", why))
        return found

    def dc(self, name: str) -> DCSpec:
        for dc in self.dcs:
            if dc.name == name:
                return dc
        raise KeyError(name)

    def find_link(self, a: str, b: str) -> tuple[int, LinkSpec, bool]:
        """(index, link, forward?) for the link between DCs a and b, in the a->b direction."""
        for index, link in enumerate(self.links):
            if link.between == (a, b):
                return index, link, True
            if link.between == (b, a):
                return index, link, False
        raise KeyError(f"no link between {a} and {b}")


def load_topology(path: str | Path) -> Topology:
    """Load a topology file; raises SpecError (one line naming file and field) when it is unusable."""
    return load_model(Topology, path)


def topology_from_data(data: Any, source: str | Path | None = None, *, si: bool = False) -> Topology:
    """Validate an inline topology (e.g. inside an experiment file); si=True for one testbed wrote itself
    (a manifest's or state file's model_dump: bare numbers are SI base units)."""
    return validate_data(Topology, data, source, si=si)

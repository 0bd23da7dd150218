"""What the user wrote, as validated pure data (pydantic models); units parsed once here."""

from testbed.spec.errors import SpecError
from testbed.spec.link import LinkParams
from testbed.spec.topology import DCSpec, IntraSpec, LinkSpec, Topology, load_topology

__all__ = ["DCSpec", "IntraSpec", "LinkParams", "LinkSpec", "SpecError", "Topology", "load_topology"]

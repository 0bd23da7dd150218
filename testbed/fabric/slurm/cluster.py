"""Which Slurm nodes play which DC, from what Slurm says of its nodes: pure functions over `scontrol show node -o`
and `scontrol show job -o` text, and the `salloc` command line that asks for exactly the nodes chosen.

A DC is the nodes with the Slurm feature named after it (the default), or what a mapping gives it: a feature, or a
list of node names (`--dc-map east=gpu_a;west=n3,n4`, or the inventory's `dcs:`). Nodes are taken in Slurm's
order (idle first when we submit); a DC that cannot get its count is refused in one line before anything is
submitted."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from testbed.spec.errors import SpecError
from testbed.spec.topology import Topology

# `Key=value` fields of scontrol's one-line output: a value runs to the next ` Key=` (values may hold spaces)
_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")
UNUSABLE = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "FUTURE", "MAINT", "REBOOT", "POWERED_DOWN", "POWERING")


def fields(line: str) -> dict[str, str]:
    """One line of `scontrol show ... -o` as {key: value} (a value may contain spaces)."""
    found = list(_FIELD.finditer(line))
    out: dict[str, str] = {}
    for index, match in enumerate(found):
        end = found[index + 1].start() if index + 1 < len(found) else len(line)
        out[match.group(1)] = line[match.end():end].strip()
    return out


@dataclass(frozen=True)
class SlurmNode:
    """A node as `scontrol show node` describes it."""

    name: str
    address: str  # NodeAddr (an address or a host name)
    features: tuple[str, ...]
    state: str  # e.g. IDLE, MIXED, ALLOCATED, DOWN+DRAIN
    partitions: tuple[str, ...]

    @property
    def usable(self) -> bool:
        return not any(word in self.state.upper() for word in UNUSABLE)

    @property
    def idle(self) -> bool:
        return self.state.upper().startswith("IDLE")


def _names(value: str) -> tuple[str, ...]:
    return tuple(part for part in value.split(",") if part and part != "(null)")


def parse_nodes(text: str) -> list[SlurmNode]:
    """`scontrol show node -o` (one node a line) as SlurmNode, in Slurm's order."""
    nodes = []
    for line in text.splitlines():
        if not line.strip().startswith("NodeName="):
            continue
        item = fields(line.strip())
        nodes.append(SlurmNode(item["NodeName"], item.get("NodeAddr") or item["NodeName"],
                               _names(item.get("ActiveFeatures") or item.get("AvailableFeatures") or item.get(
                                   "Features", "")), item.get("State", "UNKNOWN"), _names(item.get("Partitions", ""))))
    return nodes


@dataclass(frozen=True)
class SlurmJob:
    """What testbed reads of a job: its id, state, user, nodes (compressed hostlist) and comment."""

    id: str
    state: str
    user_id: int | None
    nodelist: str
    comment: str


def parse_job(text: str) -> SlurmJob:
    """`scontrol show job -o ID` as SlurmJob (the first job line)."""
    for line in text.splitlines():
        if line.strip().startswith("JobId="):
            item = fields(line.strip())
            uid = re.search(r"\((\d+)\)", item.get("UserId", ""))
            return SlurmJob(item["JobId"], item.get("JobState", "UNKNOWN"), int(uid.group(1)) if uid else None,
                            "" if item.get("NodeList") in (None, "(null)") else item["NodeList"],
                            "" if item.get("Comment") in (None, "(null)") else item["Comment"])
    raise ValueError("scontrol printed no job")


def parse_dc_map(text: str, source: str = "--dc-map") -> dict[str, tuple[str, ...]]:
    """`east=feat;west=n1,n2` (entries split by `;` or spaces) as DC -> (feature,) or (node, node ...)."""
    out: dict[str, tuple[str, ...]] = {}
    for entry in re.split(r"[;\s]+", text.strip()):
        if not entry:
            continue
        dc, sep, value = entry.partition("=")
        names = _names(value)
        if not sep or not dc or not names:
            raise SpecError(source, entry, "expected DC=FEATURE or DC=NODE,NODE...")
        if dc in out:
            raise SpecError(source, dc, "named twice")
        out[dc] = names
    return out


def assign(topology: Topology, nodes: list[SlurmNode], dc_map: dict[str, tuple[str, ...]] | None = None,
           within: tuple[str, ...] | None = None, source: str = "--dc-map") -> dict[str, tuple[str, ...]]:
    """DC -> the Slurm nodes that play it, in topology order (a DC's i-th node is node i of the DC).

    `dc_map`: DC -> a feature, or node names (a single name that is a node is a node). Without one, a DC is the
    nodes with its name as a feature. `within`: the nodes of an existing allocation (only those are taken);
    otherwise usable nodes, idle ones first. A node plays one DC only. SpecError naming the DC when it cannot."""
    dc_map = dc_map or {}
    names = [dc.name for dc in topology.dcs]
    for dc in dc_map:
        if dc not in names:
            raise SpecError(source, dc, f"topology {topology.name} has no DC {dc!r} (DCs: {', '.join(names)})")
    by_name = {node.name: node for node in nodes}
    pool = [node for node in nodes if (node.name in within if within is not None else node.usable)]
    if within is None:
        pool.sort(key=lambda node: not node.idle)  # stable: Slurm's order among idle, then the others
    taken: set[str] = set()
    out: dict[str, tuple[str, ...]] = {}
    where = "in the allocation" if within is not None else "usable in the cluster"
    for dc in topology.dcs:
        wanted = dc_map.get(dc.name, (dc.name,))
        explicit = len(wanted) > 1 or wanted[0] in by_name
        if explicit:
            unknown = [name for name in wanted if name not in by_name]
            if unknown:
                raise SpecError(source, dc.name, f"no Slurm node named {', '.join(unknown)}")
            outside = [name for name in wanted if name not in {node.name for node in pool}]
            if outside:
                raise SpecError(source, dc.name, f"node(s) {', '.join(outside)} not {where}")
            chosen = [name for name in wanted if name not in taken]
            if len(chosen) < dc.nodes:
                raise SpecError(source, dc.name, f"{len(chosen)} node(s) listed, topology {topology.name} has "
                                f"{dc.nodes} in {dc.name}")
            chosen = chosen[:dc.nodes]
        else:
            feature = wanted[0]
            candidates = [node.name for node in pool if feature in node.features and node.name not in taken]
            if len(candidates) < dc.nodes:
                raise SpecError(source if dc.name in dc_map else topology.name, f"dcs.{dc.name}",
                                f"{dc.nodes} node(s) needed, {len(candidates)} with feature {feature!r} {where}")
            chosen = candidates[:dc.nodes]
        taken.update(chosen)
        out[dc.name] = tuple(chosen)
    return out


def salloc_argv(nodes: list[str], job_name: str, comment: str, *, partition: str | None = None,
                account: str | None = None, time: str | None = None, qos: str | None = None) -> list[str]:
    """`salloc --no-shell` for exactly `nodes` (one task each), the site's settings passed through."""
    argv = ["salloc", "--no-shell", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
            f"--nodelist={','.join(nodes)}", f"--job-name={job_name}", f"--comment={comment}"]
    for flag, value in (("partition", partition), ("account", account), ("time", time), ("qos", qos)):
        if value:
            argv.append(f"--{flag}={value}")
    return argv


def granted_job(text: str) -> str | None:
    """The job id in salloc's 'Granted job allocation N' (or 'Pending job allocation N')."""
    found = re.search(r"(?:Granted|Pending) job allocation (\d+)", text)
    return found.group(1) if found else None


def is_address(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True

"""The two renderers of one Shaping agree: netlink requests (testbed.agents.tc.netlink_requests: what the netns
backend and the docker routers send through pyroute2) and tc argv (testbed.plan.shaping.tc_argv: what the ssh
backend runs on a host), on every link end of every shipped topology (and of each with jitter and loss on every
inter-DC direction, as a live change or fault gives it), under every shaper, placed on a tree of its own (netns,
docker) or as a class of a host's shared root (ssh, where the topology is a full mesh).

Pure: both renderings read back into the kernel's fields (kind, handle, parent, rate, ceil, burst as HTB's buffer
ticks, limit, netem delay/jitter ticks, loss and rate, u32 key and flowid) and compared. As root: each applied, the
argv with the real `tc` in one throwaway namespace and the requests with pyroute2 in another (a dummy interface per
link end), and the trees the kernel shows (`tc -j qdisc|class|filter show`) compared whole. netem trees are applied
only where the kernel has sch_netem: inside user-mode Linux here (this host's kernel has none).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import shlex
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from pyroute2.netlink.rtnl.tcmsg.common import tick_in_usec
from pyroute2.protocols import ETH_P_IP

from testbed.agents.tc import netlink_requests, tc_request
from testbed.plan.hosts import HOST_ROOT, build_hosts_plan
from testbed.plan.network import build_plan
from testbed.plan.shaping import ROOT, SHAPERS, Shaper, Shaping, TcObject, shaping_argv, tc_argv
from testbed.spec.errors import SpecError
from testbed.spec.inventory import Inventory
from testbed.spec.topology import Topology, load_topology
from tests.conftest import TOPOLOGIES as TOPOLOGY_DIR

TOPOLOGIES = sorted(TOPOLOGY_DIR.glob("*.yaml"))
TC_H_ROOT = 0xFFFFFFFF
U32_MAX = 2**32 - 1


@dataclass(frozen=True)
class Case:
    """One link end's tree as its backend places it: `root` is the interface's shared root (ssh) or None."""

    name: str
    shaping: Shaping
    root: TcObject | None = None

    def argv(self, dev: str) -> list[list[str]]:
        return ([tc_argv(self.root, dev)] if self.root else []) + shaping_argv(self.shaping, dev)

    def requests(self, index: int) -> list[tuple[str, str, dict[str, Any]]]:
        out = []
        if self.root is not None:
            verb, request = tc_request("add", self.root, index)
            out.append((verb, self.root.kind, request))
        return out + netlink_requests(self.shaping, index)


def faulted(topology: Topology) -> dict:
    """Every inter-DC direction with jitter (a tenth of its latency, or 1 ms) and 1 % loss on top."""
    out = {}
    for link in topology.links:
        a, b = link.between
        for key, params in ((f"{a}->{b}", link.forward()), (f"{b}->{a}", link.backward())):
            out[key] = dataclasses.replace(params, jitter=params.latency / 10 or 0.001, loss=0.01)
    return out


def inventory(topology: Topology) -> Inventory:
    """A host per node, addresses in documentation space."""
    count, dcs = 0, {}
    for dc in topology.dcs:
        dcs[dc.name] = [{"name": f"h{count + i}", "address": f"192.0.2.{count + i + 1}", "user": "root", "key": "k",
                         "interface": "eth0"} for i in range(dc.nodes)]
        count += dc.nodes
    return Inventory(dcs=dcs)


def cases(shaper: Shaper) -> list[Case]:
    """Every link end of every shipped topology (as shipped, and faulted), netns-placed and, for a full mesh,
    ssh-placed."""
    out: list[Case] = []
    for path in TOPOLOGIES:
        topology = load_topology(path)
        for variant, overrides in (("", None), ("+faulted", faulted(topology))):
            name = f"{path.stem}{variant}"
            out += [Case(f"{name}/{end.key}", end.shaping)
                    for end in build_plan(topology, shaper, "tb-", overrides).link_ends]
            try:
                hosts = build_hosts_plan(topology, inventory(topology), shaper, "tb-", overrides)
            except SpecError:  # not a full mesh: the ssh backend refuses it
                continue
            out += [Case(f"{name}/ssh/{end.key}", end.shaping, HOST_ROOT) for end in hosts.link_ends]
    return out


def test_every_shipped_topology_is_covered():
    names = {case.name.split("/")[0] for shaper in SHAPERS for case in cases(shaper)}
    assert {path.stem for path in TOPOLOGIES} <= names and len(TOPOLOGIES) >= 5
    ssh = [case for case in cases("netem") if case.root is not None]
    assert ssh and all(any(o.what == "filter" for o in case.shaping.tc) for case in ssh)
    assert any(o.kind == "netem" and o.options["loss"] and o.options["jitter"]
               for case in cases("netem") for o in case.shaping.tc)
    assert any("tos" in o.options for case in cases("netem") for o in case.shaping.tc if o.what == "filter")


# --- pure: both renderings read back into the kernel's fields -------------------------------------------------------

def _handle(text: str) -> int:
    major, _, minor = text.partition(":")
    return (int(major or "0", 16) << 16) | int(minor or "0", 16)


def _ticks(microseconds: float) -> int:
    """tc's tc_core_time2tick: whole microseconds times the kernel's ticks per microsecond, truncated."""
    return int(int(microseconds) * tick_in_usec)


def _buffer(rate: int, burst: int) -> int:
    """tc's tc_calc_xmittime: HTB's buffer (ticks) for `burst` bytes at `rate` bytes/s."""
    return _ticks(1_000_000 * burst / rate)


def _bytes(rate: str) -> int:
    assert rate.endswith("bit") and rate[:-3].isdigit(), rate
    return int(rate[:-3]) // 8


def _us(text: str) -> float:
    assert text.endswith("us"), text
    return float(text[:-2])


def from_argv(argv: list[str]) -> dict[str, Any]:
    """What `tc` sends for one command line, as the fields compared (read the way tc reads its words)."""
    assert argv[:1] == ["tc"] and argv[2] == "add" and argv[3] == "dev", argv
    what, words = argv[1], argv[5:]
    fields: dict[str, Any] = {"what": what}
    if words[0] == "root":
        fields["parent"], words = TC_H_ROOT, words[1:]
    else:
        assert words[0] == "parent", argv
        fields["parent"], words = _handle(words[1]), words[2:]
    if what in ("qdisc", "class"):
        assert words[0] == ("handle" if what == "qdisc" else "classid"), argv
        fields["handle"], words = _handle(words[1]), words[2:]
    else:
        assert words[:4] == ["protocol", "ip", "prio", words[3]], argv
        fields["protocol"], fields["prio"], words = ETH_P_IP, int(words[3]), words[4:]
    fields["kind"], words = words[0], words[1:]
    options = dict(zip(words[::2], words[1::2]))
    if (what, fields["kind"]) == ("qdisc", "htb"):
        fields["default"] = int(options.get("default", "0"), 16)
    elif (what, fields["kind"]) == ("class", "htb"):
        rate, ceil = _bytes(options["rate"]), _bytes(options["ceil"])
        fields.update(rate=rate, ceil=ceil, buffer=_buffer(rate, int(options["burst"])),
                      cbuffer=_buffer(ceil, int(options["cburst"])), quantum=int(options["quantum"]))
    elif (what, fields["kind"]) == ("qdisc", "netem"):
        delay_at = words.index("delay")
        jitter = words[delay_at + 2] if words[delay_at + 2].endswith("us") else "0us"
        loss = float(words[words.index("loss") + 1].rstrip("%")) if "loss" in words else 0.0
        fields.update(limit=int(options["limit"]), delay=_ticks(_us(words[delay_at + 1])), jitter=_ticks(_us(jitter)),
                      loss=loss, rate=_bytes(words[words.index("rate") + 1]))
    elif (what, fields["kind"]) == ("qdisc", "pfifo"):
        fields["limit"] = int(options["limit"])
    elif (what, fields["kind"]) == ("filter", "u32") and words[:2] == ["match", "u32"]:
        assert words[4] == "at" and words[6] == "flowid", argv  # tc's `match u32 VALUE MASK at OFFSET`
        fields.update(key=(int(words[2], 16), int(words[3], 16), int(words[5])), flowid=_handle(words[7]))
    elif (what, fields["kind"]) == ("filter", "u32"):
        assert words[:3] == ["match", "ip", "dst"] and words[4] == "flowid", argv
        net = ipaddress.IPv4Network(words[3])
        fields.update(key=(int(net.network_address), int(net.netmask), 16), flowid=_handle(words[5]))
    else:
        raise AssertionError(f"no reading of {shlex.join(argv)}")
    return fields


def from_request(verb: str, kind: str, request: dict[str, Any]) -> dict[str, Any]:
    """What pyroute2 sends for one request, as the fields compared."""
    what = {"add": "qdisc", "add-class": "class", "add-filter": "filter"}[verb]
    fields: dict[str, Any] = {"what": what, "kind": kind, "parent": request.get("parent", TC_H_ROOT)}
    options = request.get("options", {})
    attrs = dict(options.get("attrs", [])) if isinstance(options, dict) else {}
    if what != "filter":
        fields["handle"] = request["handle"]
    if (what, kind) == ("qdisc", "htb"):
        fields["default"] = attrs["TCA_HTB_INIT"]["defcls"]
    elif (what, kind) == ("class", "htb"):
        parms = attrs["TCA_HTB_PARMS"]
        rate = attrs.get("TCA_HTB_RATE64", parms["rate"])  # above u32: the 64-bit attribute carries it
        ceil = attrs.get("TCA_HTB_CEIL64", parms["ceil"])
        fields.update(rate=rate, ceil=ceil, buffer=parms["buffer"], cbuffer=parms["cbuffer"], quantum=parms["quantum"])
    elif (what, kind) == ("qdisc", "netem"):
        fields.update(limit=options["limit"], delay=int(options["delay"]), jitter=int(options["jitter"]),
                      loss=options["loss"] * 100 / U32_MAX, rate=attrs["TCA_NETEM_RATE"]["rate"])
    elif (what, kind) == ("qdisc", "pfifo"):
        fields["limit"] = options["limit"]
    elif (what, kind) == ("filter", "u32"):
        (key,) = request["keys"]
        value, _, rest = key.partition("/")
        mask, _, offset = rest.partition("+")
        fields.update(protocol=request["protocol"], prio=request["prio"], key=(int(value, 16), int(mask, 16),
                      int(offset)), flowid=request["target"])
    else:
        raise AssertionError(f"no reading of a {kind} {what} request")
    return fields


def same(argv_fields: dict[str, Any], netlink_fields: dict[str, Any]) -> bool:
    """Equal, loss to tc's printing of it (6 significant digits) and rounding to the kernel's u32."""
    if set(argv_fields) != set(netlink_fields):
        return False
    return all(argv_fields[k] == pytest.approx(netlink_fields[k], rel=1e-5, abs=1e-7) if k == "loss"
               else argv_fields[k] == netlink_fields[k] for k in argv_fields)


@pytest.mark.parametrize("shaper", SHAPERS)
def test_the_renderings_carry_the_same_fields(shaper: Shaper):
    checked = 0
    for case in cases(shaper):
        argv = [from_argv(line) for line in case.argv("eth0")]
        netlink = [from_request(*request) for request in case.requests(7)]
        assert len(argv) == len(netlink) == len(case.shaping.tc) + (case.root is not None), case.name
        for a, n in zip(argv, netlink):
            assert same(a, n), f"{case.name}: tc argv {a} != netlink {n}"
            checked += 1
    assert checked > 0


def test_a_renderer_that_drifts_is_caught(monkeypatch):
    """Break the argv renderer's burst once: the comparison must see it."""
    import testbed.plan.shaping as shaping

    real = shaping._options_argv

    def drifted(obj: TcObject) -> list[str]:
        words = real(obj)
        if obj.what == "class":
            words[words.index("burst") + 1] = str(obj.options["burst"] * 2)
        return words

    monkeypatch.setattr(shaping, "_options_argv", drifted)
    case = next(c for c in cases("userspace-delay") if any(o.what == "class" for o in c.shaping.tc))
    pairs = zip([from_argv(line) for line in case.argv("eth0")], [from_request(*r) for r in case.requests(7)])
    assert not all(same(a, n) for a, n in pairs)


# --- as root: the trees the kernel builds from each --------------------------------------------------------------

def _batch(ns: str, tool: str, lines: list[tuple[str, list[str]]],
           setup: list[tuple[str, list[str]]] | None = None) -> None:
    """Run every (case, argv) line with one `ip`/`tc -batch` process in `ns`: a process per line took 0.6 s apiece
    inside user-mode Linux (314 s for this file's netem cases). A failed line names its case: by the line number the
    tool prints, or (an argument it refuses ends it without one) by replaying the lines one process each in a
    namespace of its own, after `setup` (the lines that make their devices)."""
    malformed = [argv for _, argv in lines if argv[0] != tool or any(" " in word or not word for word in argv)]
    assert not malformed, f"not {tool} lines of plain words, as -batch reads them: {malformed[:3]}"
    text = "".join(shlex.join(argv[1:]) + "\n" for _, argv in lines)
    proc = subprocess.run([tool, "-n", ns, "-batch", "-"], input=text, capture_output=True, text=True, timeout=300)
    if proc.returncode == 0:
        return
    failed = re.search(r"Command failed -:(\d+)", proc.stderr)
    where = lines[int(failed.group(1)) - 1] if failed and int(failed.group(1)) <= len(lines) else _first_failing(
        f"{ns}-replay", tool, lines, setup)
    raise AssertionError(f"{tool} in {ns}: {proc.stderr.strip()}"
                         + (f" ({where[0]}: {shlex.join(where[1])})" if where else ""))


def _first_failing(ns: str, tool: str, lines: list[tuple[str, list[str]]],
                   setup: list[tuple[str, list[str]]] | None) -> tuple[str, list[str]] | None:
    """The first of `lines` that fails when each runs as a process of its own in a new namespace `ns` (removed)."""
    with namespaces(ns, 1) as (scratch,):
        if setup:
            _batch(scratch, "ip", setup)
        for name, argv in lines:
            if subprocess.run([tool, "-n", scratch, *argv[1:]], capture_output=True, timeout=30).returncode != 0:
                return name, argv
    return None


@contextmanager
def namespaces(prefix: str, count: int) -> Iterator[list[str]]:
    """`count` throwaway namespaces carrying the test's prefix, always removed."""
    names = [f"{prefix}render-{i}" for i in range(count)]
    try:
        for name in names:
            subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
        yield names
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


COUNTERS = ("STATS", "XSTATS", "PCNT", "RATE_EST")  # attributes that count traffic, not configuration


def _settings(value: Any) -> Any:
    """A dumped netlink message without its header, interface index and counters."""
    if isinstance(value, dict):
        return {key: _settings(item) for key, item in value.items() if key not in ("header", "index")}
    if isinstance(value, list):
        return [_settings(item) for item in value
                if not (isinstance(item, list) and item and isinstance(item[0], str)
                        and any(word in item[0] for word in COUNTERS))]
    return value


def loss_rounded(by_tc: dict[str, list], by_netlink: dict[str, list]) -> None:
    """netem's loss is a u32 probability: tc rounds it (rint), pyroute2 truncates; one apart (2.3e-10) is the same
    loss. Such a netlink figure is set to tc's; any other difference stays."""
    for ours, theirs in zip(by_tc["qdisc"], by_netlink["qdisc"]):
        mine, other = dict(ours["attrs"]), dict(theirs["attrs"])
        if mine.get("TCA_KIND") == other.get("TCA_KIND") == "netem":
            a, b = mine["TCA_OPTIONS"], other["TCA_OPTIONS"]
            if abs(a["loss"] - b["loss"]) <= 1:
                b["loss"] = a["loss"]


def tree(handle: Any, dev: str) -> dict[str, list]:
    """The qdiscs, classes and filters the kernel holds on `dev` (its netlink dump, counters left out)."""
    index = handle.link_lookup(ifname=dev)[0]
    return {"qdisc": [_settings(m.dump()) for m in handle.get_qdiscs(index=index)],
            "class": [_settings(m.dump()) for m in handle.get_classes(index=index)],
            "filter": [_settings(m.dump()) for m in handle.get_filters(index=index)]}


def applied_trees(prefix: str, shaper: Shaper) -> Iterator[tuple[str, dict, dict]]:
    """Each case applied both ways on a dummy interface of its own: (case, tree from argv, tree from netlink)."""
    from pyroute2 import NetNS

    from testbed.agents.tc import tc_call

    all_cases = cases(shaper)
    devs = [f"d{index}" for index in range(len(all_cases))]
    with namespaces(prefix, 2) as (by_tc, by_netlink), NetNS(by_tc) as reader, NetNS(by_netlink) as handle:
        links = [(case.name, line) for index, (case, dev) in enumerate(zip(all_cases, devs))
                 for line in (["ip", "link", "add", dev, "type", "veth", "peer", "name", f"p{index}"],
                              ["ip", "link", "set", dev, "up"])]
        for ns in (by_tc, by_netlink):
            _batch(ns, "ip", links)
        _batch(by_tc, "tc", [(case.name, line) for case, dev in zip(all_cases, devs) for line in case.argv(dev)],
               links)
        for case, dev in zip(all_cases, devs):
            link = handle.link_lookup(ifname=dev)[0]
            for obj in ((case.root,) if case.root else ()) + case.shaping.tc:
                tc_call(handle, "add", obj, link)
            yield case.name, tree(reader, dev), tree(handle, dev)


@pytest.mark.root
@pytest.mark.parametrize("shaper", [pytest.param("userspace-delay"),
                                    pytest.param("netem", marks=[pytest.mark.uml, pytest.mark.timeout(1500)])])
def test_the_kernel_builds_the_same_tree_from_both(prefix: str, shaper: Shaper):
    compared = 0
    for name, by_tc, by_netlink in applied_trees(prefix, shaper):
        loss_rounded(by_tc, by_netlink)
        assert by_tc == by_netlink, f"{name}: tc built {by_tc}, netlink {by_netlink}"
        compared += bool(by_tc["qdisc"])
    assert compared > 0


def test_root_of_a_tree_is_its_own_or_the_hosts():
    """What the root test relies on: own-root trees start at the interface's root, ssh's under HOST_ROOT."""
    for case in cases("userspace-delay"):
        parents = {o.parent for o in case.shaping.tc}
        if case.root is None:
            assert not case.shaping.tc or case.shaping.tc[0].parent == ROOT
        else:
            assert ROOT not in parents

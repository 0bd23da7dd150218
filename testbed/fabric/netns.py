"""The embedded backend: every node, DC switch and DC gateway a network namespace, built with pyroute2."""

from __future__ import annotations

import dataclasses
import errno
import os
import signal
import subprocess
import time
from contextlib import ExitStack
from typing import Any, Callable

from pyroute2 import NetlinkError, NetNS, netns

from testbed.fabric import cancel, delayline, nsexec
from testbed.fabric.state import FabricState
from testbed.fabric.state import save as save_state
from testbed.fabric.base import Fabric, FabricError, LinkCounters
from testbed.fabric.kernel import needs
from testbed.fabric.procs import alive
from testbed.fabric.tc import add_tree, change_tree, interface_counters
from testbed.plan.network import LinkEnd, NetworkPlan
from testbed.plan.shaping import DelayLineSpec, plan_shaping
from testbed.spec.link import LinkParams

NODE_SYSCTLS = {
    "net/ipv6/conf/all/disable_ipv6": "1",
    "net/ipv6/conf/default/disable_ipv6": "1",
    # Long fat links need large TCP windows: 1 Gbit/s x 100 ms is 12.5 MB in flight.
    "net/ipv4/tcp_rmem": "4096 131072 268435456",
    "net/ipv4/tcp_wmem": "4096 65536 268435456",
}
GATEWAY_SYSCTLS = {"net/ipv4/ip_forward": "1", "net/ipv4/conf/all/rp_filter": "0",
                   "net/ipv4/conf/default/rp_filter": "0"}


def _set_sysctls(ns: str, values: dict[str, str]) -> None:
    """Write /proc/sys entries as seen from inside `ns` (the net sysctls follow the thread's namespace).

    IPv6 entries are skipped on a kernel without IPv6: they only switch it off inside our namespaces."""
    netns.pushns(ns)
    try:
        for key, value in values.items():
            path = f"/proc/sys/{key}"
            if key.startswith("net/ipv6/") and not os.path.isdir("/proc/sys/net/ipv6"):
                continue
            with open(path, "w") as out:
                out.write(value)
    finally:
        netns.popns()


def list_namespaces(prefix: str) -> list[str]:
    return sorted(name for name in netns.listnetns() if name.startswith(prefix))


def kill_namespace_processes(names: list[str], timeout: float = 3.0) -> int:
    """SIGTERM, then SIGKILL, every process living in the namespaces `names`; returns how many there were."""
    wanted = set(names)
    pids = [pid for ns, members in netns.ns_pids().items() if ns in wanted for pid in members]
    if not pids:
        return 0
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 1.0)
        while time.monotonic() < deadline and any(alive(pid) for pid in pids):
            time.sleep(0.02)
    return len(pids)


def clean(prefix: str) -> list[str]:
    """Remove every namespace named `prefix*` (and the processes in it); works with no state at all.

    Interfaces live only inside our namespaces (veths are created there directly), so removing the
    namespaces removes them; a `prefix*` interface found in the host namespace is deleted too.
    """
    names = list_namespaces(prefix)
    kill_namespace_processes(names)
    for name in names:
        try:
            netns.remove(name)
        except OSError as error:
            if error.errno != errno.ENOENT:
                raise
    from pyroute2 import IPRoute

    with IPRoute() as host:
        for link in host.get_links():
            ifname = link.get_attr("IFLA_IFNAME") or ""
            if ifname.startswith(prefix):
                host.link("del", index=link["index"])
                names.append(ifname)
    return names


class NetnsFabric(Fabric):
    """Namespaces + veth + bridge per DC + gateway per DC, shaped with tc (and the userspace delay line)."""

    def __init__(self, prefix: str, on_progress: Callable[[str], None] | None = None) -> None:
        self.prefix = prefix
        self.plan: NetworkPlan | None = None
        self.state: FabricState | None = None
        self._progress = on_progress or (lambda message: None)

    def attach(self, plan: NetworkPlan, state: FabricState) -> None:
        """Adopt a testbed that an earlier process brought up."""
        self.plan, self.state = plan, state

    # --- bring-up ---------------------------------------------------------------------------------
    def up(self, plan: NetworkPlan, state: FabricState | None = None) -> None:
        """Create everything in `plan`; on any failure or interrupt, remove what was created and raise."""
        if plan.prefix != self.prefix:
            raise FabricError(f"plan prefix {plan.prefix!r} differs from fabric prefix {self.prefix!r}")
        self.plan = plan
        self.state = state
        try:
            self._build(plan)
            self._start_delay_lines(plan)
        except BaseException as error:
            clean(self.prefix)
            if isinstance(error, NetlinkError):
                raise FabricError(f"bring-up failed: {os.strerror(error.code)} ({error})") from error
            raise

    def _build(self, plan: NetworkPlan) -> None:
        with ExitStack() as stack:
            handles: dict[str, NetNS] = {}
            self._progress(f"creating {len(plan.namespaces)} namespaces")
            for space in plan.namespaces:
                cancel.check()
                with needs("network namespaces (CONFIG_NET_NS)", f"creating namespace {space.name}"):
                    netns.create(space.name)
                handles[space.name] = stack.enter_context(NetNS(space.name))
                handles[space.name].link("set", index=1, state="up")
                _set_sysctls(space.name, {**NODE_SYSCTLS, **(GATEWAY_SYSCTLS if space.forwarding else {})})
            for bridge in plan.bridges:
                with needs("bridge (module bridge)", f"creating bridge {bridge.ns}/{bridge.ifname}"):
                    handles[bridge.ns].link("add", ifname=bridge.ifname, kind="bridge")
            self._progress(f"wiring {len(plan.veths)} veth pairs")
            for pair in plan.veths:
                cancel.check()
                with needs("veth (module veth)", f"creating veth {pair.a.ns}/{pair.a.ifname}"):
                    handles[pair.a.ns].link("add", ifname=pair.a.ifname, kind="veth",
                                            peer={"ifname": pair.b.ifname, "net_ns_fd": pair.b.ns})
            indexes: dict[tuple[str, str], int] = {}
            for iface in [b for b in plan.bridges] + [i for p in plan.veths for i in (p.a, p.b)]:
                ns = handles[iface.ns]
                index = ns.link_lookup(ifname=iface.ifname)[0]
                indexes[(iface.ns, iface.ifname)] = index
                if iface.master is not None:
                    ns.link("set", index=index, master=ns.link_lookup(ifname=iface.master)[0])
                if iface.address is not None:
                    address, prefixlen = iface.address.split("/")
                    ns.addr("add", index=index, address=address, prefixlen=int(prefixlen))
                ns.link("set", index=index, state="up")
            cancel.check()
            for route in plan.routes:
                dst = "0.0.0.0/0" if route.dst == "default" else route.dst
                handles[route.ns].route("add", dst=dst, gateway=route.gateway)
            self._progress(f"shaping {len(plan.link_ends)} link ends ({plan.shaper})")
            for end in plan.link_ends:
                cancel.check()
                add_tree(handles[end.ns], indexes[(end.ns, end.ifname)], end.shaping, where=f"{end.ns}/{end.ifname}")

    def _start_delay_lines(self, plan: NetworkPlan) -> None:
        by_gateway = delayline.assignments(plan)
        if not by_gateway:
            return
        self._progress(f"starting {len(by_gateway)} userspace delay lines")
        cancel.check()
        try:
            pids = delayline.start_all(by_gateway)
        except RuntimeError as error:
            raise FabricError(str(error)) from None
        if self.state is not None:
            self.state.delay_lines = pids
            save_state(self.state)

    def _reshape_delay_line(self, key: str, spec: DelayLineSpec) -> None:
        gateway = delayline.gateway_of(self._require_plan(), key)
        pid = (self.state.delay_lines if self.state else {}).get(gateway or "")
        if gateway is None or pid is None or not alive(pid):
            raise FabricError(f"link {key}: its delay line is not running; run `testbed up` again")
        try:
            delayline.reconfigure(gateway, key, spec)
        except RuntimeError as error:
            raise FabricError(str(error)) from None

    def delay_applied(self, end: LinkEnd) -> bool:
        """Whether this end's latency/jitter/loss is really applied right now."""
        plan = self._require_plan()
        if plan.shaper == "netem":
            return end.shaping.delay_line is not None or not end.shaping.not_applied
        if end.shaping.delay_line is None:
            return not end.shaping.not_applied
        gateway = delayline.gateway_of(plan, end.key)
        pid = (self.state.delay_lines if self.state else {}).get(gateway or "")
        return pid is not None and alive(pid)

    def dead_delay_lines(self) -> list[str]:
        """Gateways whose delay line is planned but not running (its links would be dark)."""
        plan = self._require_plan()
        pids = self.state.delay_lines if self.state else {}
        return sorted(ns for ns in delayline.assignments(plan) if not alive(pids.get(ns, -1)))

    def delay_line_stats(self) -> dict[str, dict]:
        return delayline.snapshot(sorted(delayline.assignments(self._require_plan())))

    # --- teardown ---------------------------------------------------------------------------------
    def down(self) -> None:
        clean(self.prefix)

    # --- use --------------------------------------------------------------------------------------
    def popen(self, node: str, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        """Start `argv` inside node `node` (a node name such as east-0, or a namespace name)."""
        return subprocess.Popen(nsexec.argv_in(self._namespace(node), argv), **kwargs)

    def _namespace(self, node: str) -> str:
        if self.plan is not None:
            try:
                return self.plan.node(node).ns
            except KeyError:
                if node not in {space.name for space in self.plan.namespaces}:
                    raise FabricError(f"no node named {node!r} "
                                      f"(nodes: {', '.join(n.name for n in self.plan.nodes)})") from None
        return node

    def shape(self, key: str, params: LinkParams) -> None:
        """Change one link end live with `tc change` (never delete+add: flows in flight keep their queue)."""
        plan = self._require_plan()
        end = plan.link_end(key)
        new = plan_shaping(params, plan.shaper, delay_line=end.kind == "inter-dc")
        if new.delay_line is not None:
            self._reshape_delay_line(key, new.delay_line)
        try:
            with NetNS(end.ns) as ns:
                change_tree(ns, ns.link_lookup(ifname=end.ifname)[0], end.shaping, new)
        except NetlinkError as error:
            raise FabricError(f"link {key}: the kernel refused the change: {os.strerror(error.code)}") from None
        # keep the plan true to the kernel, so a later shape/counters/status sees what is applied
        self.plan = dataclasses.replace(plan, link_ends=tuple(
            dataclasses.replace(e, shaping=new) if e.key == key else e for e in plan.link_ends))

    def counters(self) -> dict[str, LinkCounters]:
        """Interface and qdisc counters of every shaped link end, keyed like the plan."""
        plan = self._require_plan()
        out: dict[str, LinkCounters] = {}
        by_ns: dict[str, list[LinkEnd]] = {}
        for end in plan.link_ends:
            by_ns.setdefault(end.ns, []).append(end)
        for name, ends in by_ns.items():
            with NetNS(name) as ns:
                for end in ends:
                    out[end.key] = interface_counters(ns, end.ifname)
        return out

    def status(self) -> dict[str, Any]:
        plan = self._require_plan()
        present = set(list_namespaces(self.prefix))
        expected = [space.name for space in plan.namespaces]
        up = sum(name in present for name in expected)
        return {"backend": "netns", "namespaces_up": up, "namespaces_planned": len(expected),
                "summary": f"{up}/{len(expected)} namespaces up"}

    def _require_plan(self) -> NetworkPlan:
        if self.plan is None:
            raise FabricError("no testbed is up (run `testbed up TOPOLOGY` first)")
        return self.plan

"""The netns fabric: namespaces, veth pairs, a bridge per DC and a gateway per DC, built with pyroute2 and
shaped with tc (and the userspace delay line, testbed.agents.delayline, where the kernel has no netem)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Any

from pyroute2 import NetlinkError, NetNS, netns

from testbed import settings
from testbed.agents import bootstrap
from testbed.agents.delayline import control as delay_lines
from testbed.agents.kernel import KernelLacks, needs
from testbed.agents.tc import LinkCounters, add_tree, change_tree, interface_counters
from testbed.fabric import cancel
from testbed.fabric.base import Fabric
from testbed.fabric.errors import FabricError
from testbed.fabric.forkserver import ForkServer
from testbed.fabric.netns.gso import set_gso_max
from testbed.fabric.netns.namespaces import list_namespaces, remove, set_sysctls
from testbed.fabric.netns.neighbours import (
    ensure_neighbour_capacity,
    neighbour_entries,
    release_neighbour_capacity,
)
from testbed.fabric.state import FabricState, state_dir
from testbed.fabric.state import save as save_state
from testbed.plan.delayline import DelayLineSpec
from testbed.plan.gso import KERNEL_DEFAULT
from testbed.plan.network import LinkEnd, NetworkPlan
from testbed.plan.shaping import plan_shaping
from testbed.plan.sysctls import ROUTER_SYSCTLS, proc_paths
from testbed.spec.link import LinkParams
from testbed.waiting import alive


class NetnsFabric(Fabric[NetworkPlan]):
    """Namespaces + veth + bridge per DC + gateway per DC, shaped with tc (and the userspace delay line)."""

    link_faults = True  # a fault is a live change of the link end: netem's loss/delay/rate, or the delay line's

    def __init__(self, prefix: str, on_progress: Callable[[str], None] | None = None) -> None:
        self.prefix = prefix
        self.plan: NetworkPlan | None = None
        self.state: FabricState | None = None
        self._progress = on_progress or (lambda message: None)
        self._kept: dict[str, NetNS] = {}  # namespace -> a netlink socket in it, opened by prepare_link_faults
        self._kept_index: dict[tuple[str, str], int] = {}  # (namespace, interface) -> its index, while kept

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
        sizes: dict[int, int] = {}
        for node in plan.nodes:
            sizes[node.dc_index] = sizes.get(node.dc_index, 0) + 1
        links = len({end.key for end in plan.link_ends if end.kind == "inter-dc"}) // 2
        raised = ensure_neighbour_capacity(neighbour_entries(list(sizes.values()), links), self.prefix)
        if raised:
            self._progress(raised)
        try:
            self._build(plan)
            self._start_delay_lines(plan)
        except BaseException as error:
            remove(self.prefix)
            release_neighbour_capacity(self.prefix)
            if isinstance(error, NetlinkError):
                raise FabricError(f"bring-up failed: {os.strerror(error.code)} ({error})") from error
            if isinstance(error, KernelLacks):
                raise FabricError(str(error)) from None
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
                set_sysctls(space.name, proc_paths(ROUTER_SYSCTLS if space.forwarding else plan.node_sysctls))
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
            for iface in [*plan.bridges, *(i for p in plan.veths for i in (p.a, p.b))]:
                ns = handles[iface.ns]
                index = ns.link_lookup(ifname=iface.ifname)[0]
                indexes[(iface.ns, iface.ifname)] = index
                if iface.master is not None:
                    ns.link("set", index=index, master=ns.link_lookup(ifname=iface.master)[0])
                if iface.address is not None:
                    ns.addr("add", index=index, address=iface.address)  # pyroute2 reads "address/prefixlen"
                ns.link("set", index=index, state="up")
            if plan.gso_max != KERNEL_DEFAULT and settings.switched_on(settings.GSO):
                by_ns: dict[str, dict[str, int]] = {}
                for (ns_name, ifname), index in indexes.items():
                    by_ns.setdefault(ns_name, {})[ifname] = index
                for ns_name, interfaces in by_ns.items():
                    set_gso_max(ns_name, interfaces, plan.gso_max)
            cancel.check()
            for route in plan.routes:
                handles[route.ns].route("add", dst=route.dst, gateway=route.gateway)  # dst: CIDR or "default"
            self._progress(f"shaping {len(plan.link_ends)} link ends ({plan.shaper})")
            for end in plan.link_ends:
                cancel.check()
                add_tree(handles[end.ns], indexes[(end.ns, end.ifname)], end.shaping, where=f"{end.ns}/{end.ifname}")

    def _start_delay_lines(self, plan: NetworkPlan) -> None:
        by_gateway = plan.delay_lines()
        if not by_gateway:
            return
        self._progress(f"starting {len(by_gateway)} userspace delay lines")
        cancel.check()
        try:
            pids = delay_lines.start_all(by_gateway, state_dir())
        except RuntimeError as error:
            raise FabricError(str(error)) from None
        if self.state is not None:
            self.state.backend_state.delay_lines = pids
            save_state(self.state)

    def _delay_line_pids(self) -> dict[str, int]:
        return self.state.backend_state.delay_lines if self.state is not None else {}

    def _reshape_delay_line(self, key: str, spec: DelayLineSpec) -> None:
        gateway = self._require_plan().delay_line_of(key)
        pid = self._delay_line_pids().get(gateway or "")
        if gateway is None or pid is None or not alive(pid):
            raise FabricError(f"link {key}: its delay line is not running; run `testbed up` again")
        try:
            delay_lines.reconfigure(state_dir(), gateway, key, spec)
        except RuntimeError as error:
            raise FabricError(str(error)) from None

    def delay_applied(self, end: LinkEnd) -> bool:
        """Whether this end's latency/jitter/loss is really applied right now."""
        plan = self._require_plan()
        if plan.shaper == "netem":
            return end.shaping.delay_line is not None or not end.shaping.not_applied
        if end.shaping.delay_line is None:
            return not end.shaping.not_applied
        pid = self._delay_line_pids().get(plan.delay_line_of(end.key) or "")
        return pid is not None and alive(pid)

    def dead_delay_lines(self) -> list[str]:
        """Gateways whose delay line is planned but not running (its links would be dark)."""
        pids = self._delay_line_pids()
        return sorted(ns for ns in self._require_plan().delay_lines() if not alive(pids.get(ns, -1)))

    def delay_line_stats(self) -> dict[str, dict]:
        return delay_lines.snapshot(state_dir(), sorted(self._require_plan().delay_lines()))

    # --- teardown ---------------------------------------------------------------------------------
    def down(self) -> None:
        self.release_link_faults()
        remove(self.prefix)
        release_neighbour_capacity(self.prefix)

    # --- use --------------------------------------------------------------------------------------
    def popen(self, node: str, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        """Start `argv` inside node `node` (a node name such as east-0, or a namespace name)."""
        return subprocess.Popen(bootstrap.argv_in(self.namespace(node), argv), **kwargs)

    def exec(self, node: str, argv: list[str]) -> int:
        """Replace this process by argv inside `node` (pyroute2 enters the namespace)."""
        namespace = self.namespace(node)
        try:
            netns.setns(namespace, flags=0)
            os.execvp(argv[0], argv)
        except OSError as error:
            raise FabricError(f"{node}: {argv[0]}: {error.strerror or error}") from None
        return 127  # not reached

    def fork_server(self, preload: str, log: Path, env: dict[str, str]) -> ForkServer:
        """One server on this machine forks ranks into any node: a setns is all a node takes."""
        return ForkServer.local(preload, log, env, self.namespace, wait=False)

    def namespace(self, node: str) -> str:
        """The namespace of node `node` (a namespace's own name is accepted as well)."""
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
        if new.tc != end.shaping.tc:  # a change of the delay line's loss or delay alone leaves the qdiscs as they are
            try:
                kept = self._kept.get(end.ns)
                with nullcontext(kept) if kept is not None else NetNS(end.ns) as ns:
                    index = self._kept_index.get((end.ns, end.ifname)) or ns.link_lookup(ifname=end.ifname)[0]
                    change_tree(ns, index, end.shaping, new)
            except NetlinkError as error:
                raise FabricError(f"link {key}: the kernel refused the change: {os.strerror(error.code)}") from None
            except KernelLacks as error:
                raise FabricError(str(error)) from None
        # keep the plan true to the kernel, so a later shape/counters/status sees what is applied
        self.plan = plan.reshaped({key: new})

    def prepare_link_faults(self) -> None:
        """A netlink socket in each inter-DC link end's namespace, opened now and kept for the faults' changes:
        opening one (pyroute2 forks a child that enters the namespace and hands the socket back) took 6 ms on the
        host and 1 s inside user-mode Linux (measured 2026-11-25), where each fault's change paid it twice. pyroute2
        keeps such a socket per thread: a lookup makes this thread's now (call it in the thread that changes). Then
        the change itself is rehearsed: each end's qdiscs changed to what they carry (the request a fault sends,
        nothing a packet sees), because inside UML a thread's first change took 0.10 s where the next took 0.03,
        its first fault 0.30-0.32 s late (2026-12-02; 5 ms on the host). Each end's interface index is kept with the
        socket: looking it up again took 6 ms of each change's 25 there (2026-12-06)."""
        for end in self._require_plan().link_ends:
            if end.kind == "inter-dc":
                if end.ns not in self._kept:
                    self._kept[end.ns] = NetNS(end.ns)
                index = self._kept[end.ns].link_lookup(ifname=end.ifname)[0]
                self._kept_index[(end.ns, end.ifname)] = index
                if end.shaping.changed():
                    change_tree(self._kept[end.ns], index, end.shaping, end.shaping)

    def release_link_faults(self) -> None:
        for ns in self._kept.values():
            ns.close()
        self._kept.clear()
        self._kept_index.clear()

    def impair(self, key: str, params: LinkParams) -> None:
        """A fault is a live change like `shape`: with netem its loss (100 %: a partition), delay or rate; with
        the delay line its loss or delay (packets dropped or held in the receiving gateway) and HTB's rate."""
        self.shape(key, params)

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

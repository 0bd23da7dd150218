"""tc requests as the kernel would receive them, built through pyroute2's own request path (no kernel, no root).

Every planned object goes through `tc_request` and pyroute2's NetlinkRequest into netlink bytes, which are
decoded again: this is the path that crashed on every kernel with netem (`rate` encoded twice).
"""

from __future__ import annotations

import errno

import pytest
from pyroute2 import NetlinkError
from pyroute2.common import AddrPool
from pyroute2.iproute.linux import get_arguments_processor
from pyroute2.netlink.nlsocket import NetlinkRequest
from pyroute2.netlink.rtnl import RTM_NEWQDISC, RTM_NEWTCLASS
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from testbed.agents.kernel import KernelLacks
from testbed.agents.tc import add_tree, change_tree, tc_request
from testbed.plan.shaping import NETEM_RATE_MAX, ROOT, TcObject, plan_shaping, tc_handle
from testbed.spec.link import LinkParams


class _Socket:
    """What NetlinkRequest reads of a socket to build a message."""

    addr_pool = AddrPool(minaddr=1, maxaddr=1000)
    status = {"nlm_echo": False}  # noqa: RUF012 (what pyroute2 reads, never written)
    epid = 1
    marshal = None


def encode(verb: str, request) -> tcmsg:
    msg_type = RTM_NEWQDISC if not verb.endswith("-class") else RTM_NEWTCLASS
    built = NetlinkRequest(_Socket(), tcmsg(), request_filter=request, msg_type=msg_type, msg_flags=1)
    built.msg.encode()
    decoded = tcmsg(built.msg.data)
    decoded.decode()
    return decoded


CASES = [
    ("netem, rate and jitter", LinkParams(latency=0.010, bandwidth=1e9, jitter=0.002, loss=0.005), "netem"),
    ("netem, no bandwidth", LinkParams(latency=0.020), "netem"),
    ("netem, jitter, no bandwidth", LinkParams(latency=0.020, jitter=0.001), "netem"),
    ("netem above u32", LinkParams(latency=0.005, bandwidth=400e9), "netem"),
    ("delay line, rate", LinkParams(latency=0.010, bandwidth=1e8), "userspace-delay"),
]


@pytest.mark.parametrize("name,params,shaper", CASES, ids=[c[0] for c in CASES])
def test_every_planned_object_encodes_as_the_kernel_expects(name, params, shaper):
    shaping = plan_shaping(params, shaper)
    assert shaping.tc, name
    for obj in shaping.tc:
        verb, request = tc_request("add", obj, 7)
        msg = encode(verb, request)
        kinds = [attr[0] for attr in msg["attrs"]]
        assert kinds == ["TCA_KIND", "TCA_OPTIONS"] or kinds == ["TCA_KIND"], kinds  # never a TCA_RATE estimator
        assert msg.get_attr("TCA_KIND") == obj.kind
        assert (msg["index"], msg["handle"]) == (7, obj.handle)
        assert msg["parent"] == (0xFFFFFFFF if obj.parent == ROOT else obj.parent)
        options = msg.get_attr("TCA_OPTIONS")
        if obj.kind == "netem":
            assert options["limit"] == obj.options["limit"]
            assert options["loss"] == int((2**32 - 1) * params.loss)
            if params.jitter:
                assert options["delay"] / options["jitter"] == pytest.approx(params.latency / params.jitter)
            rate = dict(options["attrs"])["TCA_NETEM_RATE"]["rate"]
            assert rate == obj.options["rate"]
        if obj.kind == "htb" and obj.what == "class":
            parms, rate64 = options.get_attr("TCA_HTB_PARMS"), options.get_attr("TCA_HTB_RATE64")
            assert (rate64 if parms["rate"] == 2**32 - 1 else parms["rate"]) == int(params.bandwidth / 8)


def _netem(params: LinkParams) -> TcObject:
    """The netem qdisc of a link end's planned tree."""
    return next(obj for obj in plan_shaping(params, "netem").tc if obj.kind == "netem")


def test_netem_rate_law():
    assert _netem(LinkParams(bandwidth=1e9)).options["rate"] == 125_000_000
    # above netem's u32: HTB enforces the bandwidth; netem gets none unless jitter needs it for FIFO order
    assert _netem(LinkParams(bandwidth=400e9)).options["rate"] == 0
    assert _netem(LinkParams(bandwidth=400e9, jitter=1e-3)).options["rate"] == NETEM_RATE_MAX // 8
    assert _netem(LinkParams(latency=0.01, jitter=1e-3)).options["rate"] == NETEM_RATE_MAX // 8
    assert _netem(LinkParams(latency=0.01)).options["rate"] == 0


def test_pyroute2_still_encodes_a_netem_rate_twice():
    """Why tc_request drops the top-level `rate`: if this starts passing, pyroute2 was fixed upstream."""
    obj = _netem(LinkParams(latency=0.01, bandwidth=1e9))
    raw = get_arguments_processor("tc", "add", {**obj.options, "kind": "netem", "index": 3, "handle": obj.handle,
                                                "parent": obj.parent})
    with pytest.raises(TypeError, match="has no len"):
        encode("add", raw)


class FakeHandle:
    """Records tc calls; raises `error` on the call whose kind is `fail_kind`."""

    def __init__(self, fail_kind: str | None = None, error: int = errno.ENOENT) -> None:
        self.calls: list[tuple[str, str | None, dict]] = []
        self.fail_kind, self.error = fail_kind, error

    def tc(self, verb: str, kind: str | None = None, index: int | None = None, **kwargs) -> None:
        self.calls.append((verb, kind, kwargs))
        if kind is not None and kind == self.fail_kind:
            raise NetlinkError(self.error, "fake")


def test_change_keeps_a_tree_of_the_same_shape_and_rebuilds_another():
    old = plan_shaping(LinkParams(latency=0.01, bandwidth=1e9), "netem")
    handle = FakeHandle()
    change_tree(handle, 4, old, plan_shaping(LinkParams(latency=0.03, bandwidth=5e8, loss=0.01), "netem"))
    assert [(verb, kind) for verb, kind, _ in handle.calls] == [("change-class", "htb"), ("change", "netem"),
                                                                ("change-class", "htb")]  # and the marked class's
    assert handle.calls[1][2]["request_filter"]["options"]["loss"] > 0

    handle = FakeHandle()
    change_tree(handle, 4, plan_shaping(LinkParams(latency=0.01), "netem"),
                plan_shaping(LinkParams(latency=0.01, bandwidth=1e8), "netem"))
    assert [(verb, kind) for verb, kind, _ in handle.calls] == [("del", None), ("add", "htb"), ("add-class", "htb"),
                                                                ("add", "netem"), ("add-class", "htb"),
                                                                ("add-filter", "u32")]
    assert handle.calls[0][2]["handle"] == tc_handle(0x10)  # the old root (netem alone) goes first


def test_a_qdisc_the_kernel_lacks_is_one_line_naming_it():
    shaping = plan_shaping(LinkParams(latency=0.01, bandwidth=1e9), "netem")
    with pytest.raises(KernelLacks, match=r"^this kernel lacks sch_netem: tc qdisc add netem on tb-x-gw/to-y failed"):
        add_tree(FakeHandle(fail_kind="netem"), 3, shaping, where="tb-x-gw/to-y")
    with pytest.raises(NetlinkError):  # anything but a missing feature stays what it is
        add_tree(FakeHandle(fail_kind="htb", error=errno.EINVAL), 3, shaping)


def test_a_delay_line_link_changes_its_rate_and_queue_in_place():
    old = plan_shaping(LinkParams(latency=0.01, bandwidth=1e9), "userspace-delay")
    handle = FakeHandle()
    change_tree(handle, 9, old, plan_shaping(LinkParams(latency=0.05, bandwidth=2e8), "userspace-delay"))
    assert [(verb, kind) for verb, kind, _ in handle.calls] == [("change-class", "htb"), ("change", "pfifo")]
    parms = dict(handle.calls[0][2]["request_filter"]["options"]["attrs"])["TCA_HTB_PARMS"]
    assert parms["rate"] == parms["ceil"] == int(2e8 / 8) and handle.calls[1][2]["request_filter"]["limit"] >= 1000
    handle = FakeHandle()  # unshaped before and after: nothing to tell the kernel
    change_tree(handle, 9, plan_shaping(LinkParams(latency=0.01), "userspace-delay"),
                plan_shaping(LinkParams(latency=0.02), "userspace-delay"))
    assert handle.calls == []


class CountersHandle:
    """What interface_counters reads through pyroute2: the link's 64-bit stats and each qdisc's drops."""

    class Message(dict):
        def __init__(self, attrs: dict, **fields) -> None:
            super().__init__(fields)
            self.attrs = attrs

        def get_attr(self, name: str):
            return self.attrs.get(name)

        def __bool__(self) -> bool:  # a decoded netlink message is there, whatever its fields
            return True

    def link_lookup(self, ifname: str) -> list[int]:
        return [5] if ifname == "to-west" else []

    def get_links(self, index: int):
        stats = {"tx_bytes": 10, "tx_packets": 2, "rx_bytes": 30, "rx_packets": 4}
        return [self.Message({"IFLA_STATS64": stats}, index=index)]

    def get_qdiscs(self, index: int):
        stats = self.Message({"TCA_STATS_QUEUE": {"drops": 3}})
        return [self.Message({"TCA_STATS2": stats}), self.Message({"TCA_STATS2": stats}), self.Message({})]


def test_counters_are_the_interfaces_and_every_qdiscs_drops():
    from testbed.agents.tc import LinkCounters, interface_counters

    assert interface_counters(CountersHandle(), "to-west") == LinkCounters(10, 2, 30, 4, 6)

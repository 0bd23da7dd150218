"""The congestion control a topology names: in the plan of every emulated backend, refused on real hosts, and
checked against this host's kernel before anything is built (a namespace may only pick an allowed one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.fabric.tcp import congestion_control_refusal
from testbed.plan.containers import build_containers_plan
from testbed.plan.network import build_plan
from testbed.spec.errors import SpecError
from testbed.spec.topology import topology_from_data
from tests.support.topologies import pair_data

BASE = pair_data("t", latency="5ms")


def proc(tmp_path: Path, available: str, allowed: str) -> Path:
    (tmp_path / "tcp_available_congestion_control").write_text(available + "\n")
    (tmp_path / "tcp_allowed_congestion_control").write_text(allowed + "\n")
    return tmp_path


@pytest.mark.parametrize(("name", "needle"), [
    ("cubic", None), ("reno", None),
    ("bbr", "not in this kernel (available: reno cubic; a module, tcp_bbr, may provide it"),
    ("dctcp", "lets namespaces pick only reno cubic (net.ipv4.tcp_allowed_congestion_control); to allow dctcp, "
              "as root: sysctl -w net.ipv4.tcp_allowed_congestion_control='reno cubic dctcp'")])
def test_the_host_must_have_and_allow_the_congestion_control(tmp_path, name, needle):
    why = congestion_control_refusal(name, proc(tmp_path, "reno cubic dctcp" if name == "dctcp" else "reno cubic",
                                                "reno cubic"))
    assert why == needle if needle is None else needle in why


def test_every_emulated_node_gets_the_topologys_congestion_control_and_no_other_setting_changes():
    plain = topology_from_data(BASE)
    chosen = topology_from_data({**BASE, "tcp": {"congestion_control": "cubic"}})
    assert "net.ipv4.tcp_congestion_control" not in build_plan(plain, "netem").node_sysctls
    sysctls = build_plan(chosen, "netem").node_sysctls
    assert sysctls == {**build_plan(plain, "netem").node_sysctls, "net.ipv4.tcp_congestion_control": "cubic"}
    containers = build_containers_plan(chosen, "netem", "tb-").containers
    nodes = [c for c in containers if c.role == "node"]
    assert nodes and all(c.sysctls["net.ipv4.tcp_congestion_control"] == "cubic" for c in nodes)
    assert all("net.ipv4.tcp_congestion_control" not in c.sysctls for c in containers if c.role == "router")


def test_a_congestion_control_is_a_kernel_name():
    with pytest.raises(SpecError, match=r"tcp\.congestion_control"):
        topology_from_data({**BASE, "tcp": {"congestion_control": "Cubic; rm -rf"}})

"""The seam between plans and backends: every backend's plan is a TestbedView (testbed.plan.view) carrying the same
nodes and inter-DC link ends for a topology, plus its own layout; Backend[PlanT].plan() returns its PlanT; the ssh
hosts' commands are their link ends' Shaping rendered as tc argv."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from testbed.fabric.docker.backend import DockerBackend
from testbed.fabric.netns.backend import NetnsBackend
from testbed.fabric.ssh.backend import SshBackend, SshOptions
from testbed.plan.containers import ContainersPlan, build_containers_plan
from testbed.plan.hosts import HOST_ROOT, HostsPlan, accounting_rule, build_hosts_plan
from testbed.plan.network import NetworkPlan, build_plan
from testbed.plan.shaping import shaping_argv, tc_argv
from testbed.plan.view import TestbedView
from testbed.spec import LinkParams, load_topology
from testbed.spec.inventory import load_inventory
from tests.conftest import ROOT, TOPOLOGIES

INVENTORY = ROOT / "inventories" / "example-two-dc.yaml"


def two_dc():
    return load_topology(TOPOLOGIES / "two-dc.yaml")


def views() -> dict[str, TestbedView]:
    topology = two_dc()
    return {"netns": build_plan(topology, "userspace-delay", "tb-"),
            "docker": build_containers_plan(topology, "userspace-delay", "tb-"),
            "ssh": build_hosts_plan(topology, load_inventory(INVENTORY), "userspace-delay", "tb-")}


def test_every_backends_plan_is_a_view_of_the_same_testbed():
    planned = views()
    assert all(isinstance(p, TestbedView) for p in planned.values())
    assert (type(planned["netns"]), type(planned["docker"]), type(planned["ssh"])) == (
        NetworkPlan, ContainersPlan, HostsPlan)
    for plan in planned.values():
        assert (plan.topology, plan.prefix, plan.shaper) == ("two-dc", "tb-", "userspace-delay")
        assert [n.name for n in plan.nodes] == ["east-0", "east-1", "west-0", "west-1"]
        assert [(link.a, link.b, link.forward, link.backward) for link in plan.links] == [
            ("east", "west", "east->west", "west->east")]
        inter = {e.key: e.shaping.params for e in plan.link_ends if e.kind == "inter-dc"}
        assert inter == {k: e.shaping.params for k, e in ((e.key, e) for e in planned["netns"].link_ends)
                         if e.kind == "inter-dc"}


def test_the_ssh_plan_holds_no_netns_layout():
    ssh = views()["ssh"]
    assert not any(hasattr(ssh, name) for name in ("namespaces", "veths", "bridges", "routes"))
    assert ssh.network is ssh  # what readers of `.network` once got: the view itself


def test_each_ssh_host_runs_its_link_ends_shaping_as_tc_argv():
    plan = views()["ssh"]
    for item in plan.hosts:
        dev = item.host.interface
        expected = [tc_argv(HOST_ROOT, dev)]
        for dc in [dc for dc in ("east", "west") if dc != item.node.dc]:
            expected += shaping_argv(plan.link_end(f"{item.node.dc}->{dc}").shaping, dev)
            expected.append(accounting_rule(dev, tuple(n.address for n in plan.nodes if n.dc == dc), dc, "tb-"))
        assert [list(c) for c in item.apply] == expected


def test_a_live_change_reshapes_one_link_end_of_the_view():
    plan = views()["netns"]
    from testbed.plan.shaping import plan_shaping

    new = plan_shaping(LinkParams(latency=0.004, bandwidth=1e8), plan.shaper)
    changed = plan.reshaped({"east->west": new})
    assert type(changed) is NetworkPlan and changed.link_end("east->west").shaping is new
    assert changed.link_end("west->east") == plan.link_end("west->east") and changed.veths == plan.veths


def test_docker_shows_its_requested_shaper_until_the_routers_resolve_it():
    auto = build_containers_plan(two_dc(), "auto", "tb-")
    assert auto.shaper == "auto" and {e.shaping.shaper for e in auto.link_ends} == {"userspace-delay"}
    resolved = auto.with_shaper("netem", {"east->west": LinkParams(latency=0.002)})
    assert resolved.shaper == "netem"
    inter = {e.key: e.shaping for e in resolved.link_ends if e.kind == "inter-dc"}
    assert {s.shaper for s in inter.values()} == {"netem"} and inter["east->west"].params.latency == 0.002
    access = [e for e in resolved.link_ends if e.kind == "access"]
    assert access and all(e.shaping.tc == () and e.shaping.not_applied for e in access)  # capless nodes


@pytest.mark.parametrize(("backend", "plan_type"), [(NetnsBackend, NetworkPlan), (DockerBackend, ContainersPlan),
                                                    (SshBackend, HostsPlan)])
def test_each_backend_is_generic_in_the_plan_it_returns(backend, plan_type, tmp_path: Path):
    (declared,) = typing.get_args(backend.__orig_bases__[0])
    assert declared is plan_type and issubclass(plan_type, TestbedView)
    made = backend(SshOptions(inventory=INVENTORY)) if backend is SshBackend else backend()
    assert isinstance(made.plan(two_dc(), "auto", "tb-"), plan_type)

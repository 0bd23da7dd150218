"""The docker fabric against an injected stand-in for the docker SDK client (no engine, no root): what it asks the
engine to create, how it waits for the routers, what it removes on failure, and how it drives the router agent."""

from __future__ import annotations

import json
import subprocess

import pytest

from testbed.agents import bootstrap
from testbed.agents.router import CONTROL_SCRIPT
from testbed.fabric.docker import fabric as docker_fabric
from testbed.fabric.docker.fabric import LIVE_CODE, DockerFabric
from testbed.fabric.errors import FabricError
from testbed.plan.containers import ROUTER_COMMAND, ROUTER_ENV, RouterConfig, build_containers_plan
from testbed.spec.link import LinkParams
from tests.support.fake_docker import FakeClient
from tests.support.topologies import pair_topology

TOPOLOGY = pair_topology(east=2, latency="10ms", bandwidth="1gbit")
PREFIX = "tbf-"


@pytest.fixture(autouse=True)
def no_settling(monkeypatch):
    """A failed bring-up keeps looking for late containers for a while on a real engine; not on this one."""
    monkeypatch.setattr(docker_fabric, "SETTLE_AFTER_FAILURE_S", 0.0)


def up(client: FakeClient, shaper: str = "auto") -> DockerFabric:
    fabric = DockerFabric(PREFIX, TOPOLOGY, "testbed:test", client=client)
    fabric.up(build_containers_plan(TOPOLOGY, shaper, PREFIX))
    return fabric


def test_up_creates_the_planned_networks_and_containers_and_ships_the_code():
    client = FakeClient()
    up(client)
    plan = build_containers_plan(TOPOLOGY, "auto", PREFIX)
    networks = {name: kwargs for kind, name, kwargs in client.created if kind == "network"}
    assert set(networks) == {net.name for net in plan.networks}
    for net in plan.networks:
        ipam = networks[net.name]["ipam"]["Config"][0]
        assert (ipam["Subnet"], ipam["Gateway"]) == (net.subnet, net.gateway)
        assert networks[net.name]["options"]["com.docker.network.bridge.inhibit_ipv4"] == "true"
    containers = {c.name: c for c in client.containers.items}
    assert set(containers) == {plan.container_name(spec) for spec in plan.containers}
    router = containers[f"{PREFIX}east-gw"]
    assert router.kwargs["cap_add"] == ["NET_ADMIN"] and router.command == [*ROUTER_COMMAND, "serve"]
    assert RouterConfig.from_json(router.kwargs["environment"][ROUTER_ENV]).dc == "east"
    node = containers[f"{PREFIX}east-1"]
    assert node.kwargs["cap_add"] is None and node.labels["testbed.node"] == "east-1"
    for container in containers.values():  # the controller's own code, where PYTHONPATH points, running
        assert container.kwargs["environment"]["PYTHONPATH"] == LIVE_CODE and container.status == "running"
        assert [path for path, _ in container.archives] == ["/opt"]


def test_the_shaper_is_the_one_the_routers_resolved():
    fabric = up(FakeClient(shaper="userspace-delay"))
    assert fabric.plan is not None and fabric.plan.shaper == "userspace-delay"
    inter = [end for end in fabric.plan.link_ends if end.kind == "inter-dc"]
    assert inter and all(end.shaping.delay_line is not None for end in inter)


def test_routers_that_disagree_are_refused():
    client = FakeClient()
    client.answer = lambda c, argv: (0, json.dumps({"shaper": "netem" if "east" in c.name else "userspace-delay"})
                                     .encode())
    with pytest.raises(FabricError, match=r"the routers resolved different shapers \(netem, userspace-delay\)"):
        up(client)


def test_a_failed_bring_up_removes_what_it_made():
    client = FakeClient(fail_create="west-gw")  # the last container: networks and the others exist by then
    with pytest.raises(FabricError, match=r"docker: .*cannot create tbf-west-gw"):
        up(client)
    assert client.containers.items == [] and client.networks.items == []
    assert "network tbf-east" in client.removed and "container tbf-east-0" in client.removed


def test_a_router_that_exits_is_named_with_its_last_words():
    client = FakeClient(start_as=lambda c: "exited" if c.name.endswith("east-gw") else "running")
    with pytest.raises(FabricError, match=r"router east-gw did not come up \(exited\): .*lacks sch_htb"):
        up(client)
    assert client.containers.items == []


def test_a_subnet_another_network_holds_is_refused_before_anything_is_made():
    client = FakeClient()
    client.networks.create("somebody", "bridge", {}, {"testbed": "tb-other-"},
                           {"Config": [{"Subnet": "198.18.0.0/24"}]})
    client.created.clear()
    with pytest.raises(FabricError, match=r"network somebody already uses 198.18.0.0/24.*testbed clean --prefix tb-other-"):
        up(client)
    assert client.created == []


def test_shape_counters_and_health_go_through_the_router_agent():
    client = FakeClient()
    fabric = up(client)
    client.execs.clear()
    fabric.shape("east->west", LinkParams(latency=0.02, bandwidth=5e8))
    shaped = [(name, argv) for name, argv in client.execs if argv[:3] == ["sh", "-c", CONTROL_SCRIPT]]
    assert sorted(name for name, _ in shaped) == [f"{PREFIX}east-gw", f"{PREFIX}west-gw"]  # sender's tc, receiver's line
    assert all(json.loads(argv[-1]) == [["east->west", {"latency": 0.02, "bandwidth": 5e8, "jitter": 0.0, "loss": 0.0,
                                                        "queue": None}]] for _, argv in shaped)
    assert fabric.plan.link_end("east->west").shaping.params.latency == 0.02
    assert fabric.counters()["east->west"].tx_bytes == 1000
    assert fabric.dead_delay_lines() == []
    client.containers.items[-1].status = "exited"  # west-gw
    fabric._health = None
    assert fabric.dead_delay_lines() == ["west-gw"]
    assert not fabric.delay_applied(fabric.plan.link_end("east->west"))


def test_a_partition_is_one_script_per_router_with_both_directions():
    client = FakeClient()
    fabric = up(client)
    client.execs.clear()
    dark = LinkParams(latency=0.01, loss=1.0)
    fabric.impair_all({"east->west": dark, "west->east": dark})
    requests = [(name, json.loads(argv[-1])) for name, argv in client.execs if argv[:3] == ["sh", "-c", CONTROL_SCRIPT]]
    assert sorted(name for name, _ in requests) == [f"{PREFIX}east-gw", f"{PREFIX}west-gw"]  # one script per router
    for _, pairs in requests:
        assert [key for key, _ in pairs] == ["east->west", "west->east"] and all(p["loss"] == 1.0 for _, p in pairs)
    assert {fabric.plan.link_end(k).shaping.params.loss for k in ("east->west", "west->east")} == {1.0}


def test_popen_runs_the_one_bootstrap_with_only_the_env_contract(tmp_path):
    client = FakeClient()
    fabric = up(client)
    proc = fabric.popen("west-0", ["/usr/bin/python3", "-m", "x"], stdout=subprocess.PIPE,
                        env={"RANK": "2", "HOME": "/root", "TESTBED_METRICS_DIR": str(tmp_path)})
    assert proc.pid == 4242 and proc.stdout.read() == b"hello\n" and proc.wait(5) == 0
    call = client.api.created[-1]
    assert call["container"] == f"id-{PREFIX}west-0"
    python, flag, source, spec = call["cmd"]
    assert (python, flag, source) == ("python", "-c", bootstrap.source())
    spec = json.loads(spec)
    assert spec["argv"] == ["/usr/bin/python3", "-m", "x"] and spec["pid"] and spec["session"]
    assert "HOME" not in call["environment"] and call["environment"]["RANK"] == "2"
    assert call["environment"]["TESTBED_METRICS_DIR"] in spec["mkdirs"]  # the container's own copy of the dir
    with pytest.raises(FabricError, match="no node named 'north-0'"):
        fabric.popen("north-0", ["true"])

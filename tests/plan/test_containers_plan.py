"""The docker backend's plan and the compose files generated from it are pure: checked without docker."""

from __future__ import annotations

import ipaddress
import json

import pytest
import yaml

from testbed.plan.compose import compose_document
from testbed.plan.containers import LABEL, ROUTER_ENV, build_containers_plan
from testbed.plan.network import build_plan
from testbed.spec import load_topology
from testbed.spec.topology import topology_from_data
from tests.conftest import ROOT, TOPOLOGIES, run_cli
from tests.support.topologies import link_data, topology_data

# the committed compose files and what each is generated from (a test regenerates them all)
COMPOSE_FILES = {
    "quickstart.yml": ("topologies/two-dc.yaml", "experiments/quickstart.yaml"),
    **{f"{path.stem}.yml": (f"topologies/{path.name}", None) for path in sorted(TOPOLOGIES.glob("*.yaml"))},
}


def router(plan, dc):
    spec = next(c for c in plan.containers if c.role == "router" and c.dc == dc)
    return spec, json.loads(spec.environment[ROUTER_ENV])


def test_nodes_keep_the_netns_addresses_and_have_no_capabilities():
    topology = load_topology(TOPOLOGIES / "two-dc.yaml")
    plan = build_containers_plan(topology)
    netns = build_plan(topology, "userspace-delay")
    nodes = [c for c in plan.containers if c.role == "node"]
    assert [(c.service, c.attachments[0].address) for c in nodes] == [(n.name, n.address) for n in netns.nodes]
    assert all(not c.cap_add and len(c.attachments) == 1 for c in nodes)
    assert {c.service for c in plan.routers()} == {"east-gw", "west-gw"}
    assert all(c.cap_add == ("NET_ADMIN",) and c.sysctls["net.ipv4.ip_forward"] == "1" for c in plan.routers())
    # a router's state and delay-line files are in memory: faults rewrite them while a cell runs
    assert all(c.tmpfs == ("/run/testbed",) and c.environment["TESTBED_STATE_DIR"] == "/run/testbed"
               for c in plan.routers()) and not any(c.tmpfs for c in nodes)
    # every node can name every other node, also as the IPv4-mapped address gloo's store sees
    east0 = nodes[0]
    assert ("west-1", "198.18.1.3") in east0.extra_hosts and ("west-1", "::ffff:198.18.1.3") in east0.extra_hosts
    assert all(name != "east-0" for name, _ in east0.extra_hosts)


def test_routers_claim_the_gateway_nodes_default_to_and_route_over_link_networks():
    plan = build_containers_plan(load_topology(TOPOLOGIES / "two-dc.yaml"))
    lans = {n.name: n for n in plan.networks if n.role == "lan"}
    links = [n for n in plan.networks if n.role == "link"]
    assert lans["tb-east"].gateway == "198.18.0.1" and lans["tb-east"].subnet == "198.18.0.0/24"
    assert len(links) == 1 and ipaddress.ip_network(links[0].subnet).prefixlen == 29
    east, config = router(plan, "east")
    lan_address = east.attachments[0].address
    assert config["gateway"] == "198.18.0.1/24"  # what docker gave the nodes as their default route
    assert config["interfaces"][lan_address] == "lan" and ipaddress.ip_address(lan_address) in ipaddress.ip_network(
        "198.18.0.0/24")
    west, _west_config = router(plan, "west")
    west_link = next(a.address for a in west.attachments if a.network == links[0].name)
    assert config["routes"] == [{"dst": "198.18.1.0/24", "via": west_link}]
    assert [e["key"] for e in config["egress"]] == ["east->west"]
    assert [e["key"] for e in config["ingress"]] == ["west->east"]  # delayed on arrival, like the netns gateway
    assert config["egress"][0]["params"]["latency"] == pytest.approx(0.010)


def test_multi_hop_routes_follow_the_shortest_path():
    plan = build_containers_plan(load_topology(TOPOLOGIES / "chain-4dc-8.yaml"))
    dcs = [c.dc for c in plan.routers()]
    _first, config = router(plan, dcs[0])
    assert len(config["routes"]) == len(dcs) - 1
    assert len({r["via"] for r in config["routes"]}) == 1  # the end of a chain has one way out


def test_a_lan_without_room_for_the_router_is_refused():
    data = topology_data("full", {"a": 13, "b": 1}, [link_data("a", "b", latency="1ms")], subnet="198.18.0.0/26")
    with pytest.raises(ValueError, match="no free address left for the DC router"):
        build_containers_plan(topology_from_data(data))


def test_compose_document_labels_everything_and_mounts_results():
    topology = load_topology(TOPOLOGIES / "two-dc.yaml")
    plan = build_containers_plan(topology, prefix="tbx-")
    doc = compose_document(plan, ROOT / "compose" / "x.yml", TOPOLOGIES / "two-dc.yaml",
                           ROOT / "experiments" / "quickstart.yaml", TOPOLOGIES / "two-dc.yaml")
    assert all(service["labels"][LABEL] == "tbx-" for service in doc["services"].values())
    assert all(net["labels"][LABEL] == "tbx-" for net in doc["networks"].values())
    controller = doc["services"]["controller"]
    assert "../results:/results" in controller["volumes"] and "..:/input:ro" in controller["volumes"]
    assert controller["command"][3:5] == ["run", "/input/experiments/quickstart.yaml"]
    assert {"--adopt", "tbx-"} <= set(controller["command"])
    assert controller["depends_on"]["east-gw"] == {"condition": "service_healthy"}
    assert all("cap_add" not in doc["services"][n] for n in ("east-0", "east-1", "west-0", "west-1"))


@pytest.mark.parametrize("name", sorted(COMPOSE_FILES))
def test_committed_compose_files_are_what_the_generator_writes(name, tmp_path):
    topology, experiment = COMPOSE_FILES[name]
    committed = ROOT / "compose" / name
    assert committed.exists(), f"compose/{name} is missing: run testbed compose {topology} {experiment or ''}"
    args = ["compose", topology, *([experiment] if experiment else []), "-o", f"compose/{name}"]
    expected = run_cli(*args[:-2], "--prefix", "tb-", check=True).stdout  # to stdout: the committed file stays
    assert yaml.safe_load(committed.read_text()) == yaml.safe_load(expected)
    header = committed.read_text().splitlines()[0]
    assert f"testbed {' '.join(args)}" in header


def test_compose_refuses_an_experiment_of_another_topology():
    proc = run_cli("compose", "topologies/three-dc-ring.yaml", "experiments/quickstart.yaml")
    assert proc.returncode == 2
    assert "experiments/quickstart.yaml: topology:" in proc.stderr and "Traceback" not in proc.stderr


def test_dry_run_prints_networks_containers_and_routes_without_docker(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich wraps table cells to the terminal's width
    proc = run_cli("up", "--dry-run", "--backend", "docker", "topologies/two-dc.yaml", "--prefix", "tb-")
    assert proc.returncode == 0, proc.stderr
    for text in ("tb-east-west", "198.18.2.0/29", "NET_ADMIN", "198.18.1.0/24 via", "not shaped"):
        assert text in proc.stdout, text

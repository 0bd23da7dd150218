"""The netns backend on the real kernel: bring-up, reachability, shaping objects, counters, teardown."""

import json
import subprocess
import sys

import pytest
from pyroute2 import NetNS

from testbed.fabric.lifecycle import attach, bring_up, tear_down
from testbed.fabric.netns.namespaces import list_namespaces
from testbed.spec import load_topology
from tests.conftest import TOPOLOGIES

pytestmark = pytest.mark.root

REACH = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
s.sendto(b"x", (sys.argv[1], 9)); print("sent")
"""
ECHO_SERVER = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 7000)); print("ready", flush=True)
while True:
    data, peer = s.recvfrom(100); s.sendto(data, peer)
"""
ECHO_CLIENT = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
s.sendto(b"ping", (sys.argv[1], 7000)); print(s.recvfrom(100)[0].decode())
"""


def _round_trip(testbed, src: str, dst: str) -> str:
    server = testbed.fabric.popen(dst, [sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        client = testbed.fabric.popen(src, [sys.executable, "-c", ECHO_CLIENT, testbed.plan.node(dst).address],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = client.communicate(timeout=20)
        return out.strip() or err.strip()
    finally:
        server.kill()
        server.wait()


def test_chain_of_four_dcs_routes_end_to_end(prefix):
    topology = load_topology(TOPOLOGIES / "chain-4dc-8.yaml")
    testbed = bring_up(topology, prefix=prefix)
    assert len(list_namespaces(prefix)) == 4 * 8 + 4 * 2
    assert _round_trip(testbed, "a-0", "d-7") == "ping"  # three inter-DC hops
    assert _round_trip(testbed, "c-3", "c-5") == "ping"  # inside a DC, through the switch
    tear_down(prefix)
    assert list_namespaces(prefix) == []


def test_links_carry_the_planned_qdiscs_and_counters_move(prefix):
    topology = load_topology(TOPOLOGIES / "two-dc.yaml")
    testbed = bring_up(topology, prefix=prefix, shaper="userspace-delay")
    end = testbed.plan.link_end("east->west")
    with NetNS(end.ns) as ns:
        index = ns.link_lookup(ifname=end.ifname)[0]
        kinds = sorted(q.get_attr("TCA_KIND") for q in ns.get_qdiscs(index=index))
        classes = [c for c in ns.get_classes(index=index) if c.get_attr("TCA_KIND") == "htb"]
    assert kinds == ["htb", "pfifo"]
    htb = classes[0].get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS")
    assert htb["rate"] == 125_000_000  # 1 Gbit/s in bytes/s
    before = testbed.fabric.counters()["east->west"]
    assert _round_trip(testbed, "east-1", "west-0") == "ping"
    after = testbed.fabric.counters()["east->west"]
    assert after.tx_packets > before.tx_packets and after.tx_bytes > before.tx_bytes


def test_access_links_are_rate_shaped(prefix):
    testbed = bring_up(load_topology(TOPOLOGIES / "two-dc.yaml"), prefix=prefix)
    keys = {end.key for end in testbed.plan.link_ends}
    assert {"east-0:up", "east-0:down"} <= keys  # two-dc gives east an intra bandwidth
    end = testbed.plan.link_end("east-0:up")
    with NetNS(end.ns) as ns:
        kinds = {q.get_attr("TCA_KIND") for q in ns.get_qdiscs(index=ns.link_lookup(ifname=end.ifname)[0])}
    assert "htb" in kinds


def test_state_lets_a_new_process_attach(prefix):
    bring_up(load_topology(TOPOLOGIES / "asymmetric.yaml"), prefix=prefix)
    again = attach(prefix)
    assert again.plan.node("west-1").address == "198.18.1.3"
    assert again.fabric.status()["namespaces_up"] == 8


def test_up_on_a_stale_testbed_cleans_first(prefix):
    topology = load_topology(TOPOLOGIES / "two-dc.yaml")
    bring_up(topology, prefix=prefix)
    testbed = bring_up(topology, prefix=prefix)  # would fail with EEXIST if it did not clean
    assert _round_trip(testbed, "east-0", "west-1") == "ping"


def test_failure_during_bring_up_leaves_nothing(prefix, monkeypatch):
    from testbed.fabric.netns import fabric as netns_fabric

    def broken(*args, **kwargs):
        raise RuntimeError("injected failure after the namespaces exist")

    monkeypatch.setattr(netns_fabric.NetnsFabric, "_start_delay_lines", broken)
    with pytest.raises(RuntimeError, match="injected"):
        bring_up(load_topology(TOPOLOGIES / "two-dc.yaml"), prefix=prefix)
    assert list_namespaces(prefix) == []


def test_status_json_reports_shaper_and_links(prefix):
    from tests.conftest import run_cli

    run_cli("up", str(TOPOLOGIES / "three-dc-ring.yaml"), check=True)
    info = json.loads(run_cli("status", "--json", check=True).stdout)
    assert info["shaper"] in ("netem", "userspace-delay")
    keys = {link["key"] for link in info["links"]}
    assert {"east->central", "central->east", "west->east", "east->west"} <= keys
    ring = {link["key"]: link for link in info["links"]}
    assert ring["west->east"]["bandwidth"] == "500mbit"
    assert ring["east->central"]["latency"] == "3.92ms"
    assert all(link["shaper"] == info["shaper"] for link in info["links"])

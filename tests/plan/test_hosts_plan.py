"""The ssh backend's plan is pure too: which host plays which node and the exact tc/iptables argv per host."""

from __future__ import annotations

import pytest

from testbed.plan.hosts import ROOT_HANDLE, build_hosts_plan, class_commands
from testbed.spec import LinkParams, load_topology
from testbed.spec.errors import SpecError
from testbed.spec.inventory import load_inventory
from tests.conftest import ROOT, TOPOLOGIES, run_cli
from tests.support.topologies import pair_topology

INVENTORY = ROOT / "inventories" / "example-two-dc.yaml"


def plan(shaper="userspace-delay", topology="two-dc", **kwargs):
    return build_hosts_plan(load_topology(TOPOLOGIES / f"{topology}.yaml"), load_inventory(INVENTORY), shaper, "tb-",
                            inventory_file=str(INVENTORY), **kwargs)


def test_hosts_play_nodes_in_rank_order():
    p = plan()
    assert [(h.node.name, h.host.name) for h in p.hosts] == [("east-0", "rack1-a"), ("east-1", "rack1-b"),
                                                              ("west-0", "rack2-a"), ("west-1", "rack2-b")]
    assert [n.address for n in p.network.nodes] == ["198.18.100.11", "198.18.100.12", "198.18.101.11", "198.18.101.12"]
    assert {end.key for end in p.network.link_ends} == {"east->west", "west->east"}
    assert p.host("rack2-b").node.name == "west-1" and p.host("west-1").host.name == "rack2-b"


def test_each_host_gets_one_class_per_peer_dc_with_filters_on_its_addresses():
    east0 = plan().hosts[0]
    commands = [" ".join(c) for c in east0.apply]
    assert commands[0] == f"tc qdisc add dev eth0 root handle {ROOT_HANDLE} htb"
    assert "tc class add dev eth0 parent 7e57: classid 7e57:11 htb rate 1000000000bit ceil 1000000000bit" in commands[1]
    assert commands[2] == "tc qdisc add dev eth0 parent 7e57:11 handle 11: pfifo limit 1652"
    filters = [c for c in commands if " filter " in c]
    assert [f.split(" dst ")[1] for f in filters] == ["198.18.101.11/32 flowid 7e57:11", "198.18.101.12/32 flowid 7e57:11"]
    assert commands[-1].endswith("-s 198.18.101.11,198.18.101.12 -m comment --comment testbed:tb-:rx:west")
    # the delay of west->east is applied where it arrives: on the east hosts, for packets from the west hosts
    (direction,) = east0.delay_line
    assert direction.key == "west->east" and direction.latency == pytest.approx(0.010)
    assert direction.sources == ("198.18.101.11", "198.18.101.12") and direction.comment == "testbed:tb-"


def test_netem_leaf_carries_delay_jitter_loss_and_limit():
    argv = class_commands("eth1", "7e57:12", LinkParams(latency=0.02, bandwidth=1e9, jitter=0.001, loss=0.001), "netem")
    assert argv[1] == ["tc", "qdisc", "add", "dev", "eth1", "parent", "7e57:12", "handle", "12:", "netem", "limit",
                       argv[1][11], "delay", "20000us", "1000us", "loss", "0.1%", "rate", "1000000000bit"]
    assert int(argv[1][11]) >= 1000
    change = class_commands("eth1", "7e57:12", LinkParams(latency=0.005), "netem", verb="change")
    assert change[0][:3] == ["tc", "class", "change"] and "100000000000bit" in change[0]  # uncapped link
    assert not plan("netem").hosts[0].delay_line


def test_live_overrides_change_only_their_direction():
    p = plan(overrides={"east->west": LinkParams(latency=0.03, bandwidth=5e8)})
    assert p.network.link_end("east->west").shaping.params.latency == pytest.approx(0.03)
    assert p.network.link_end("west->east").shaping.params.latency == pytest.approx(0.01)
    west0 = p.host("west-0")
    assert west0.delay_line[0].latency == pytest.approx(0.03)


def test_inventory_that_does_not_fit_the_topology_is_one_line(tmp_path):
    bad = tmp_path / "inv.yaml"
    bad.write_text(INVENTORY.read_text().replace("  west:", "  north:"))
    with pytest.raises(SpecError, match=r"dcs.north: topology two-dc has no DC 'north' \(DCs: east, west\)"):
        build_hosts_plan(load_topology(TOPOLOGIES / "two-dc.yaml"), load_inventory(bad), "netem", "tb-",
                         inventory_file=str(bad))
    three = pair_topology("t", east=3, west=2)
    with pytest.raises(SpecError, match=r"dcs.east: 2 host\(s\) listed, topology t has 3 node\(s\) in east"):
        build_hosts_plan(three, load_inventory(INVENTORY), "netem", "tb-")


def test_dry_run_prints_every_hosts_commands_without_connecting(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # the commands stay on one line each
    proc = run_cli("up", "--dry-run", "--backend", "ssh", "--inventory", str(INVENTORY), str(TOPOLOGIES / "two-dc.yaml"))
    assert proc.returncode == 0, proc.stderr
    for host in ("rack1-a", "rack1-b", "rack2-a", "rack2-b"):
        assert host in proc.stdout
    assert "sudo -n tc qdisc add dev eth0 root handle 7e57: htb" in proc.stdout


def test_ssh_backend_needs_an_inventory():
    proc = run_cli("up", "--backend", "ssh", str(TOPOLOGIES / "two-dc.yaml"))
    assert proc.returncode == 2 and proc.stderr.strip() == "error: --backend ssh needs --inventory FILE"

"""The Slurm backend's pure parts: what scontrol says read back, which Slurm node plays which DC (features, a
mapping, an allocation), the salloc line, the job plan and the shaping every node derives from it. No Slurm, no
root."""

from __future__ import annotations

import json

import pytest

from testbed.fabric.slurm import backend as slurm_backend
from testbed.fabric.slurm.cluster import (
    assign,
    fields,
    granted_job,
    parse_dc_map,
    parse_job,
    parse_nodes,
    salloc_argv,
)
from testbed.fabric.slurm.jobplan import JobPlan, PlacedNode, hosts_plan, node_plan
from testbed.spec.errors import SpecError
from testbed.spec.topology import topology_from_data

# as scontrol 22.05 prints them (OS holds spaces and a '#'; one node down)
NODE = ("NodeName={name} Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=3.19 "
        "AvailableFeatures={features} ActiveFeatures={features} Gres=(null) NodeAddr={address} NodeHostName={name} "
        "Version=22.05.8 OS=Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1 AllocMem=0 FreeMem=20086 "
        "Sockets=2 Boards=1 State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
        "Partitions=lab  BootTime=2026-11-28T11:33:33 CfgTRES=cpu=2,mem=1M,billing=2 AllocTRES= CapWatts=n/a")


def scontrol(*rows: tuple[str, str, str, str]) -> str:
    return "\n".join(NODE.format(name=n, features=f, address=a, state=s) for n, f, a, s in rows) + "\n"


CLUSTER = scontrol(("a1", "east,gpu", "10.0.0.1", "IDLE"), ("a2", "east", "10.0.0.2", "ALLOCATED"),
                   ("a3", "east", "10.0.0.3", "IDLE"), ("b1", "west", "10.0.0.4", "IDLE"),
                   ("b2", "west", "10.0.0.5", "DOWN+DRAIN"), ("b3", "west", "10.0.0.6", "MIXED"))


def topology(**sizes: int):
    dcs = [{"name": name, "nodes": count} for name, count in sizes.items()]
    names = list(sizes)
    links = [{"between": [a, b], "latency": "10ms", "bandwidth": "1gbit"}
             for i, a in enumerate(names) for b in names[i + 1:]]
    return topology_from_data({"name": "t", "dcs": dcs, "links": links})


def test_scontrol_lines_are_read_with_values_that_hold_spaces():
    nodes = parse_nodes(CLUSTER)
    assert [n.name for n in nodes] == ["a1", "a2", "a3", "b1", "b2", "b3"]
    assert nodes[0].features == ("east", "gpu") and nodes[0].address == "10.0.0.1"
    assert nodes[0].partitions == ("lab",) and nodes[0].idle
    assert not nodes[4].usable and nodes[5].usable and not nodes[5].idle
    assert fields(NODE.format(name="x", features="f", address="h", state="IDLE"))["OS"] == \
        "Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0"


def test_a_dc_is_its_feature_idle_nodes_first_and_down_ones_never():
    placed = assign(topology(east=2, west=2), parse_nodes(CLUSTER))
    assert placed == {"east": ("a1", "a3"), "west": ("b1", "b3")}


def test_a_dc_short_of_nodes_is_refused_in_one_line_naming_it_and_its_feature():
    with pytest.raises(SpecError) as refused:
        assign(topology(east=2, west=3), parse_nodes(CLUSTER))
    assert str(refused.value) == "t: dcs.west: 3 node(s) needed, 2 with feature 'west' usable in the cluster"
    assert "\n" not in str(refused.value)


def test_a_mapping_gives_a_dc_a_feature_or_named_nodes():
    mapping = parse_dc_map("east=gpu; west=b3,b1")
    assert mapping == {"east": ("gpu",), "west": ("b3", "b1")}
    assert assign(topology(east=1, west=2), parse_nodes(CLUSTER), mapping) == {"east": ("a1",), "west": ("b3", "b1")}
    assert assign(topology(east=1, west=1), parse_nodes(CLUSTER), {"west": ("a2",)}) == {"east": ("a1",),
                                                                                        "west": ("a2",)}


@pytest.mark.parametrize("mapping, message", [
    ("north=a1", "--dc-map: north: topology t has no DC 'north' (DCs: east, west)"),
    ("west=b1,zz", "--dc-map: west: no Slurm node named zz"),
    ("west=b1,b2", "--dc-map: west: node(s) b2 not usable in the cluster"),
    ("west=b1", "--dc-map: west: 1 node(s) listed, topology t has 2 in west"),
    ("east=a1,a3 west=a1,b1", "--dc-map: west: 1 node(s) listed, topology t has 2 in west"),
])
def test_a_mapping_the_cluster_cannot_satisfy_is_one_line(mapping, message):
    with pytest.raises(SpecError) as refused:
        assign(topology(east=2, west=2), parse_nodes(CLUSTER), parse_dc_map(mapping))
    assert str(refused.value) == message


@pytest.mark.parametrize("text", ["east", "east=", "=a1", "east=a1;east=a2"])
def test_a_malformed_mapping_is_refused(text):
    with pytest.raises(SpecError):
        parse_dc_map(text)


def test_inside_an_allocation_only_its_nodes_are_taken():
    nodes = parse_nodes(CLUSTER)
    assert assign(topology(east=1, west=1), nodes, within=("a2", "b3")) == {"east": ("a2",), "west": ("b3",)}
    with pytest.raises(SpecError, match="1 with feature 'east' in the allocation"):
        assign(topology(east=2, west=1), nodes, within=("a2", "b3"))


def test_salloc_asks_for_exactly_the_chosen_nodes_and_passes_the_site_settings_through():
    argv = salloc_argv(["a1", "b1"], "testbed-tb", "testbed:tb-:/x.json", partition="gpu", account="proj",
                       time="00:30:00", qos="high")
    assert argv[:2] == ["salloc", "--no-shell"]
    assert {"--nodes=2", "--ntasks=2", "--nodelist=a1,b1", "--job-name=testbed-tb", "--comment=testbed:tb-:/x.json",
            "--partition=gpu", "--account=proj", "--time=00:30:00", "--qos=high"} <= set(argv)
    assert not [a for a in salloc_argv(["a1"], "n", "c") if a.startswith(("--partition", "--account", "--qos"))]
    assert granted_job("salloc: Granted job allocation 42\nsalloc: Waiting for resource configuration") == "42"
    assert granted_job("salloc: error: Job submit/allocate failed") is None


def test_a_job_line_gives_its_user_nodes_and_comment():
    job = parse_job("JobId=7 JobName=testbed-tb UserId=alice(1001) GroupId=alice(1001) JobState=RUNNING "
                    "Comment=testbed:tb-:/home/alice/.testbed/slurm/tb.slurm.json NodeList=east-[0-1],west-0 "
                    "BatchHost=east-0\n")
    assert (job.id, job.state, job.user_id, job.nodelist) == ("7", "RUNNING", 1001, "east-[0-1],west-0")
    assert job.comment == "testbed:tb-:/home/alice/.testbed/slurm/tb.slurm.json"
    assert parse_job("JobId=8 UserId=root(0) JobState=PENDING Comment=(null) NodeList=(null)").comment == ""


def job_plan(shaper: str = "userspace-delay", prefix: str = "tb-") -> JobPlan:
    topo = topology(east=2, west=1)
    nodes = [PlacedNode("east-0", "east", "a1", "10.0.0.1", "eth0"), PlacedNode("east-1", "east", "a3", "10.0.0.3",
                                                                                "ib0"),
             PlacedNode("west-0", "west", "b1", "10.0.0.4", "eth1")]
    return JobPlan(prefix, shaper, topo.model_dump(mode="json", exclude_unset=False), nodes, root="sudo")


def test_the_job_plan_round_trips_and_refuses_a_prefix_that_could_leave_its_directory():
    plan = job_plan()
    assert JobPlan.load(plan.dump()) == plan
    bad = json.loads(plan.dump()) | {"prefix": "../../etc/"}
    with pytest.raises(ValueError, match="prefix"):
        JobPlan.load(json.dumps(bad))


@pytest.mark.parametrize("shaper", ["netem", "userspace-delay"])
def test_each_node_shapes_its_own_interface_per_peer_dc_by_the_peers_addresses(shaper):
    hosts = hosts_plan(job_plan(shaper))
    east0 = hosts.host("a1")
    assert east0.node.name == "east-0" and east0.host.interface == "eth0"
    commands = [" ".join(argv) for argv in east0.apply]
    assert commands[0] == "tc qdisc add dev eth0 root handle 7e57: htb"
    assert any("u32 match ip dst 10.0.0.4/32 flowid 7e57:11" in c for c in commands)  # west's only node
    assert not any("10.0.0.3/32" in c for c in commands)  # its own DC's traffic is not shaped
    assert ("netem" in " ".join(commands)) == (shaper == "netem")
    west = hosts.host("b1")
    assert [c for c in map(" ".join, west.apply) if "u32" in c] == [
        f"tc filter add dev eth1 parent 7e57: protocol ip prio 1 u32 match ip dst {a}/32 flowid 7e57:10"
        for a in ("10.0.0.1", "10.0.0.3")]
    assert bool(west.delay_line) == (shaper == "userspace-delay")
    assert hosts.node("east-1").address == "10.0.0.3"


def test_a_node_derives_the_commands_the_controller_planned_for_it():
    plan = job_plan()
    planned = hosts_plan(plan)
    for item in plan.nodes:
        assert node_plan(plan, item.slurm, item.interface) == planned.host(item.slurm)


class FakeCluster:
    def __init__(self, prolog: str = "(null)", root: bool = False) -> None:
        self.config = f"Prolog                  = {prolog}\nEpilog                  = {prolog}\n"
        self.root = root

    def install(self, monkeypatch):
        monkeypatch.setattr(slurm_backend, "slurm", lambda argv, **_: self.config)
        monkeypatch.setattr(slurm_backend, "can_be_root", lambda: self.root)
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)


def test_nobody_to_shape_is_refused_in_one_line_naming_both_ways(monkeypatch):
    FakeCluster().install(monkeypatch)
    refusal = slurm_backend.SlurmBackend().host_refusal(topology(east=1, west=1))
    assert refusal is not None and "\n" not in refusal
    assert "testbed slurm prolog|epilog" in refusal and "sudo -n" in refusal


def test_a_prolog_that_is_not_testbeds_does_not_count(monkeypatch, tmp_path):
    other = tmp_path / "prolog"
    other.write_text("#!/bin/sh\nexit 0\n")
    FakeCluster(str(other)).install(monkeypatch)
    assert slurm_backend.SlurmBackend().host_refusal(topology(east=1, west=1)) is not None
    ours = tmp_path / "ours"
    ours.write_text("#!/bin/sh\nexec testbed slurm prolog\n")
    FakeCluster(str(ours)).install(monkeypatch)
    backend = slurm_backend.SlurmBackend()
    assert backend.host_refusal(topology(east=1, west=1)) is None and backend._root == "prolog"


def test_sudo_or_root_is_taken_first_and_an_allocation_never_waits_for_its_prolog(monkeypatch):
    FakeCluster("/etc/slurm/prolog", root=True).install(monkeypatch)
    backend = slurm_backend.SlurmBackend()
    assert backend.host_refusal(topology(east=1, west=1)) is None and backend._root == "sudo"
    FakeCluster("/etc/slurm/prolog").install(monkeypatch)
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    refusal = slurm_backend.SlurmBackend(slurm_backend.SlurmOptions(root="prolog")).host_refusal(
        topology(east=1, west=1))
    assert refusal is not None and "has run already" in refusal


def test_an_inventory_file_gives_the_mapping_and_the_site_settings(tmp_path):
    inventory = tmp_path / "slurm.yaml"
    inventory.write_text("dcs: {east: gpu, west: [b3, b1]}\npartition: p\ntime: '10:00'\nroot: sudo\n")
    merged = slurm_backend.SlurmBackend(slurm_backend.SlurmOptions(inventory=inventory, qos="q"))._settings
    assert merged.dc_map == "east=gpu;west=b3,b1" and (merged.partition, merged.time, merged.qos) == ("p", "10:00", "q")
    assert merged.root == "sudo"
    inventory.write_text("dcs: {east: gpu}\nnodes: 3\n")
    with pytest.raises(SpecError, match=r"slurm\.yaml: nodes"):
        slurm_backend.SlurmBackend(slurm_backend.SlurmOptions(inventory=inventory))


def test_a_direction_served_by_every_node_of_its_dc_adds_up_their_figures():
    from testbed.fabric.slurm.fabric import merge_figures

    busy = {"worker": 7, "released": 40, "warmed": 30, "woke_late": 9, "cold": 1, "late": {"0": 30, "5": 10},
            "path_ms": 0.01}
    idle = {"worker": 9, "released": 2, "warmed": 2, "woke_late": 0, "late": {"0": 1, "9": 1}, "path_ms": None}
    for merged in (merge_figures(busy, idle), merge_figures(idle, busy)):
        assert merged == {"worker": 7, "released": 42, "warmed": 32, "woke_late": 9, "cold": 1,
                          "late": {"0": 31, "5": 10, "9": 1}, "path_ms": 0.01}


def test_clean_without_state_or_job_plan_runs_no_slurm_command(monkeypatch, tmp_path):
    """Every backend's clean runs at every teardown (a netns one too): with nothing of Slurm's recorded, no
    squeue, which would wait for a controller that is not there."""
    def no_slurm(*_):
        raise AssertionError("a Slurm command ran")

    monkeypatch.setattr(slurm_backend, "find_job", no_slurm)
    monkeypatch.setattr(slurm_backend, "restore_by_job", no_slurm)
    assert slurm_backend.clean_unrecorded("tb-", tmp_path / "tb.slurm.json") == []


def test_a_rank_takes_tcp_on_its_nodes_shaped_interface_unless_told_otherwise():
    """InfiniBand and RoCE bypass the qdiscs: a rank's NCCL is told to use sockets on the interface testbed shapes
    (the runner tells only emulated backends' ranks so); gloo's interface is the node's too."""
    from testbed.fabric.slurm.fabric import SlurmFabric

    plan = job_plan()
    fabric = SlurmFabric("tb-", plan.topology_spec(), slurm_backend.SlurmOptions())
    fabric.job = plan
    env, cwd, _ = fabric._node_env("east-1", {"RANK": "1", "GLOO_SOCKET_IFNAME": "eth0", "HOME": "/x"})
    assert (env["NCCL_IB_DISABLE"], env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"]) == ("1", "ib0", "ib0")
    assert "HOME" not in env and cwd == "/var/tmp/testbed/tb-a3/run"
    told, _, _ = fabric._node_env("west-0", {"RANK": "2", "NCCL_IB_DISABLE": "0", "NCCL_SOCKET_IFNAME": "eth9"})
    assert (told["NCCL_IB_DISABLE"], told["NCCL_SOCKET_IFNAME"]) == ("0", "eth1")  # the user's choice; its interface
    server, _, _ = fabric._node_env("west-0", {"OMP_NUM_THREADS": "1"})
    assert "NCCL_IB_DISABLE" not in server  # a fork server or probe agent is no rank

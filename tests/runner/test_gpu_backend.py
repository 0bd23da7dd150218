"""Which collective backend and GPU a rank takes: NCCL only where every rank sharing the machine's GPUs has one of
its own (NCCL refuses two ranks on one device: seen on an H100 with 2 ranks, 2026-11-24), else gloo on the CPU;
under an emulated testbed every rank of it shares this machine's GPUs and NCCL is kept on the emulated links."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from testbed.plan.network import build_plan
from testbed.runner.ranks import EMULATED_NCCL, SHAPED_NCCL, rank_layout
from testbed.spec.topology import topology_from_data
from testbed.workload.groups import backend, gpu_slot
from tests.support.topologies import pair_data

PAIR = pair_data(east=2, west=2, latency="10ms")


@pytest.fixture
def gpus(monkeypatch):
    def have(count: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    for name in ("TESTBED_DIST_BACKEND", "TESTBED_GPU_SHARERS", "TESTBED_GPU_SLOT", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return have


@pytest.mark.parametrize("count,sharers,expected", [
    (0, "1", "gloo"), (1, "1", "nccl"), (1, "2", "gloo"), (1, "4", "gloo"), (4, "4", "nccl"), (8, "4", "nccl")])
def test_nccl_only_where_every_rank_has_a_gpu_of_its_own(gpus, monkeypatch, count, sharers, expected):
    gpus(count)
    monkeypatch.setenv("TESTBED_GPU_SHARERS", sharers)
    assert backend() == expected


def test_torchruns_local_world_counts_without_the_harness_and_a_choice_overrides(gpus, monkeypatch):
    gpus(2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert backend() == "nccl"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert backend() == "gloo"
    monkeypatch.setenv("TESTBED_DIST_BACKEND", "nccl")
    assert backend() == "nccl"
    monkeypatch.setenv("TESTBED_DIST_BACKEND", "mpi")
    with pytest.raises(ValueError, match="TESTBED_DIST_BACKEND: gloo or nccl"):
        backend()


def test_a_rank_takes_the_gpu_of_its_place_among_the_sharers(gpus, monkeypatch):
    gpus(4)
    assert gpu_slot(1) == 1
    monkeypatch.setenv("TESTBED_GPU_SLOT", "3")
    assert gpu_slot(0) == 3


def test_emulated_ranks_share_the_machines_gpus_and_nccl_takes_the_emulated_links():
    topology = topology_from_data(PAIR)
    plan = build_plan(topology, "userspace-delay")
    emulated = rank_layout(topology, plan, 2, Path("/tmp/m"), master_port=20001)
    assert [s.env["TESTBED_GPU_SLOT"] for s in emulated] == [str(r) for r in range(8)]
    assert {s.env["TESTBED_GPU_SHARERS"] for s in emulated} == {"8"}
    assert all(s.env[key] == value for s in emulated for key, value in EMULATED_NCCL.items())
    hosts = rank_layout(topology, plan, 2, Path("/tmp/m"), master_port=20001, emulated=False)
    assert [s.env["TESTBED_GPU_SLOT"] for s in hosts] == ["0", "1"] * 4
    assert {s.env["TESTBED_GPU_SHARERS"] for s in hosts} == {"2"}
    # real hosts keep their GPUs' own paths inside a node, but never RDMA across: it would bypass the shaped links
    assert not any(key in s.env for s in hosts for key in EMULATED_NCCL.keys() - SHAPED_NCCL.keys())
    assert all(s.env["NCCL_IB_DISABLE"] == "1" for s in hosts)

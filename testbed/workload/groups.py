"""Process groups built from the DC layout: intra-DC, inter-DC (the same index in every DC; see
Layout.inter_group for unequal DCs) and extra inter-DC "lanes" so several chunks can be in flight on
separate connections."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from testbed import rankenv
from testbed.workload.layout import Layout


@dataclass
class Groups:
    layout: Layout
    intra: dist.ProcessGroup
    intra_gather: dist.ProcessGroup  # a second intra-DC group, for a second communication thread
    inter: dist.ProcessGroup  # this rank's inter-DC group
    lanes: list[dist.ProcessGroup]  # inter-DC groups (lanes[0] is `inter`)
    intra_ranks: list[int]
    inter_ranks: list[int]

    @property
    def world(self) -> dist.ProcessGroup:
        return dist.group.WORLD


def backend() -> str:
    """nccl where every rank sharing this machine's GPUs has one of its own, else gloo on the CPU: NCCL refuses
    two ranks on one device ("Duplicate GPU detected", seen on an H100 with 2 ranks, 2026-11-24). The sharers are
    TESTBED_GPU_SHARERS (the harness: every rank of a testbed emulated on this machine) or LOCAL_WORLD_SIZE
    (torchrun's ranks on this host); TESTBED_DIST_BACKEND=gloo|nccl chooses outright."""
    chosen = os.environ.get(rankenv.DIST_BACKEND)
    if chosen:
        if chosen not in ("gloo", "nccl"):
            raise ValueError(f"{rankenv.DIST_BACKEND}: gloo or nccl, not {chosen!r}")
        return chosen
    sharers = int(os.environ.get(rankenv.GPU_SHARERS) or os.environ.get("LOCAL_WORLD_SIZE") or 1)
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= sharers else "gloo"


def gpu_slot(local_rank: int) -> int:
    """Which of this machine's GPUs the rank takes under nccl: its place among the ranks sharing them
    (TESTBED_GPU_SLOT, else its local rank)."""
    return int(os.environ.get(rankenv.GPU_SLOT) or local_rank) % max(1, torch.cuda.device_count())


def build_groups(layout: Layout, lanes: int = 1, second_intra: bool = False) -> Groups:
    """Every rank creates every group in the same order (a torch.distributed requirement). Each group a rank is
    in costs it connections and gloo's worker threads, so `intra_gather` is a group of its own only with
    `second_intra` (else it is `intra`), and `lanes` should be 1 unless a strategy spreads chunks over lanes."""
    intra = intra_gather = inter = None
    lane_groups: list[dist.ProcessGroup] = []
    for dc in range(layout.num_dcs):
        group = dist.new_group(layout.dc_ranks(dc))
        second = dist.new_group(layout.dc_ranks(dc)) if second_intra else group
        if dc == layout.dc:
            intra, intra_gather = group, second
    for _lane in range(max(1, lanes)):
        for k in range(layout.inter_count):
            group = dist.new_group(layout.inter_group(k))
            if k == layout.inter_index:
                lane_groups.append(group)
    inter = lane_groups[0]
    assert intra is not None and intra_gather is not None and inter is not None
    return Groups(layout, intra, intra_gather, inter, lane_groups, layout.dc_ranks(layout.dc),
                  layout.inter_group(layout.inter_index))

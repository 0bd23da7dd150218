"""Process groups built from the DC layout: intra-DC, inter-DC (the same index in every DC; see
Layout.inter_group for unequal DCs) and extra inter-DC "lanes" so several chunks can be in flight on
separate connections."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

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
    return "nccl" if torch.cuda.is_available() else "gloo"


def build_groups(layout: Layout, lanes: int = 1) -> Groups:
    """Every rank creates every group in the same order (a torch.distributed requirement)."""
    intra = intra_gather = inter = None
    lane_groups: list[dist.ProcessGroup] = []
    for dc in range(layout.num_dcs):
        group = dist.new_group(layout.dc_ranks(dc))
        second = dist.new_group(layout.dc_ranks(dc))
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

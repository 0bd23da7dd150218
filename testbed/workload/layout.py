"""Where this rank sits: its DC and index inside it, from torchrun's env plus the TESTBED_* contract."""

from __future__ import annotations

import os
from dataclasses import dataclass


class LayoutError(ValueError):
    """The environment does not describe a consistent DC layout; str() is one line."""


@dataclass(frozen=True)
class Layout:
    rank: int
    world: int
    local_rank: int
    dc: int
    num_dcs: int
    nodes_per_dc: int

    @property
    def index_in_dc(self) -> int:
        return self.rank - self.dc * self.nodes_per_dc

    def dc_of(self, rank: int) -> int:
        return rank // self.nodes_per_dc

    def dc_ranks(self, dc: int) -> list[int]:
        return list(range(dc * self.nodes_per_dc, (dc + 1) * self.nodes_per_dc))

    def peers_across_dcs(self, index: int) -> list[int]:
        """The ranks with the same index inside every DC (one per DC)."""
        return [dc * self.nodes_per_dc + index for dc in range(self.num_dcs)]


def _int(env: dict[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value is None:
        if default is None:
            raise LayoutError(f"environment variable {name} is not set")
        return default
    try:
        return int(value)
    except ValueError:
        raise LayoutError(f"environment variable {name}={value!r} is not an integer") from None


def layout_from_env(env: dict[str, str] | None = None) -> Layout:
    """RANK/WORLD_SIZE/LOCAL_RANK from torchrun; TESTBED_NUM_DCS, TESTBED_NODES_PER_DC, TESTBED_DC optional.

    Ranks are numbered DC by DC. Without TESTBED_DC (plain torchrun gives every local rank one env) the
    DC is RANK // TESTBED_NODES_PER_DC.
    """
    env = dict(os.environ if env is None else env)
    rank, world = _int(env, "RANK", 0), _int(env, "WORLD_SIZE", 1)
    num_dcs = _int(env, "TESTBED_NUM_DCS", 1)
    nodes = _int(env, "TESTBED_NODES_PER_DC", max(1, world // max(num_dcs, 1)))
    if num_dcs < 1 or nodes < 1 or num_dcs * nodes != world:
        raise LayoutError(f"TESTBED_NUM_DCS={num_dcs} x TESTBED_NODES_PER_DC={nodes} does not match "
                          f"WORLD_SIZE={world}")
    dc = _int(env, "TESTBED_DC", rank // nodes)
    if dc != rank // nodes:
        raise LayoutError(f"TESTBED_DC={dc} but rank {rank} falls in DC {rank // nodes}: ranks must be "
                          "numbered DC by DC")
    return Layout(rank, world, _int(env, "LOCAL_RANK", 0), dc, num_dcs, nodes)

"""Where this rank sits: its DC and index inside it, from torchrun's env plus the TESTBED_* contract.

DCs may hold different numbers of ranks (TESTBED_DC_SIZES). Ranks are numbered DC by DC."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

from testbed import rankenv


class LayoutError(ValueError):
    """The environment does not describe a consistent DC layout; str() is one line."""


@dataclass(frozen=True)
class Layout:
    rank: int
    world: int
    local_rank: int
    dc: int
    dc_sizes: tuple[int, ...]  # ranks per DC, DC by DC

    @property
    def num_dcs(self) -> int:
        return len(self.dc_sizes)

    @property
    def equal(self) -> bool:
        return len(set(self.dc_sizes)) == 1

    @property
    def nodes_per_dc(self) -> int | None:
        """Ranks per DC when every DC holds the same number; None otherwise."""
        return self.dc_sizes[0] if self.equal else None

    @cached_property
    def _starts(self) -> tuple[int, ...]:
        starts, total = [], 0
        for size in self.dc_sizes:
            starts.append(total)
            total += size
        return tuple(starts)

    def dc_start(self, dc: int) -> int:
        return self._starts[dc]

    @property
    def dc_size(self) -> int:
        return self.dc_sizes[self.dc]

    @property
    def index_in_dc(self) -> int:
        return self.rank - self.dc_start(self.dc)

    def dc_of(self, rank: int) -> int:
        for dc in reversed(range(self.num_dcs)):
            if rank >= self._starts[dc]:
                return dc
        raise ValueError(f"rank {rank} outside the layout")

    def dc_ranks(self, dc: int) -> list[int]:
        return list(range(self._starts[dc], self._starts[dc] + self.dc_sizes[dc]))

    # Inter-DC groups: with n = the smallest DC's size, group k holds every rank whose index in its DC is
    # k modulo n. With equal DCs that is "the rank with index k in every DC"; with unequal ones a DC may
    # place several ranks (holding the same values, as DC-internal data parallelism keeps them) in a group.
    @property
    def inter_count(self) -> int:
        return min(self.dc_sizes)

    def inter_group(self, k: int) -> list[int]:
        n = self.inter_count
        return [r for dc in range(self.num_dcs) for r in self.dc_ranks(dc) if (r - self._starts[dc]) % n == k]

    @property
    def inter_index(self) -> int:
        return self.index_in_dc % self.inter_count

    @property
    def inter_weight(self) -> float:
        """1 / the number of this DC's ranks in this rank's inter-DC group: scaled by it, a sum over the
        group counts every DC once."""
        return 1.0 / sum(1 for r in self.inter_group(self.inter_index) if self.dc_of(r) == self.dc)


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


def _sizes(env: dict[str, str], world: int) -> tuple[int, ...]:
    text = env.get(rankenv.DC_SIZES)
    if text is None:
        num_dcs = _int(env, rankenv.NUM_DCS, 1)
        nodes = _int(env, rankenv.NODES_PER_DC, max(1, world // max(num_dcs, 1)))
        if num_dcs < 1 or nodes < 1 or num_dcs * nodes != world:
            raise LayoutError(f"{rankenv.NUM_DCS}={num_dcs} x {rankenv.NODES_PER_DC}={nodes} does not match "
                              f"WORLD_SIZE={world}")
        return (nodes,) * num_dcs
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise LayoutError(f"{rankenv.DC_SIZES}={text!r}: expected comma-separated rank counts, e.g. 2,1,2") from None
    if not sizes or min(sizes) < 1 or sum(sizes) != world:
        raise LayoutError(f"{rankenv.DC_SIZES}={text} does not add up to WORLD_SIZE={world}")
    if rankenv.NUM_DCS in env and _int(env, rankenv.NUM_DCS) != len(sizes):
        raise LayoutError(f"{rankenv.NUM_DCS}={env[rankenv.NUM_DCS]} but {rankenv.DC_SIZES}={text} lists {len(sizes)}")
    if rankenv.NODES_PER_DC in env and {_int(env, rankenv.NODES_PER_DC)} != set(sizes):
        raise LayoutError(f"{rankenv.NODES_PER_DC}={env[rankenv.NODES_PER_DC]} but {rankenv.DC_SIZES}={text}")
    return sizes


def layout_from_env(env: dict[str, str] | None = None) -> Layout:
    """RANK/WORLD_SIZE/LOCAL_RANK from torchrun; TESTBED_DC_SIZES (or TESTBED_NUM_DCS and
    TESTBED_NODES_PER_DC for equal DCs) and TESTBED_DC optional.

    Ranks are numbered DC by DC. Without TESTBED_DC (plain torchrun gives every local rank one env) the
    DC is the one rank RANK falls in.
    """
    env = dict(os.environ if env is None else env)
    rank, world = _int(env, "RANK", 0), _int(env, "WORLD_SIZE", 1)
    sizes = _sizes(env, world)
    probe = Layout(rank, world, 0, 0, sizes)
    if not 0 <= rank < world:
        raise LayoutError(f"RANK={rank} is outside WORLD_SIZE={world}")
    where = probe.dc_of(rank)
    dc = _int(env, rankenv.DC, where)
    if dc != where:
        raise LayoutError(f"{rankenv.DC}={dc} but rank {rank} falls in DC {where}: ranks must be numbered DC by DC")
    return Layout(rank, world, _int(env, "LOCAL_RANK", 0), dc, sizes)

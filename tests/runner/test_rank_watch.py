"""Which rank a failed cell names: the first to die where the launcher knows the order (fork), else one ended by
a signal (a killed rank) before one that exited with an error (its peers, when their connections reset)."""

from __future__ import annotations

from pathlib import Path

from testbed.fabric.process import PopenLike
from testbed.plan.network import Node
from testbed.runner.ranks import RankGroup, RankSpec


class Ended(PopenLike):
    def __init__(self, code: int | None, order: tuple[int, int] | None = None) -> None:
        self.returncode, self.argv, self.stdout, self.stderr = code, ["rank"], None, None
        if order is not None:
            self.order = order

    def poll(self) -> int | None:
        return self.returncode


def group(tmp_path: Path, procs: list[PopenLike]) -> RankGroup:
    """A group of processes already started (RankGroup's own start is the launchers' tests')."""
    watched = RankGroup.__new__(RankGroup)
    node = Node("east-0", "east", 0, 0, "tb-east-0", "198.18.0.1")
    watched.specs = [RankSpec(rank, node, 0, {}) for rank in range(len(procs))]
    watched.procs, watched.log_dir, watched._logs = procs, tmp_path, []
    return watched


def test_a_rank_ended_by_a_signal_is_named_before_peers_that_exited_with_an_error(tmp_path):
    outcome = group(tmp_path, [Ended(1), Ended(-9), Ended(None)]).watch(5)
    assert not outcome.ok and outcome.failed_rank == 1 and "signal 9" in outcome.reason


def test_without_a_signal_the_lowest_rank_is_named(tmp_path):
    assert group(tmp_path, [Ended(None), Ended(1), Ended(2)]).watch(5).failed_rank == 1


def test_a_known_order_comes_first(tmp_path):
    outcome = group(tmp_path, [Ended(-9, order=(3, 1)), Ended(1, order=(3, 0))]).watch(5)
    assert outcome.failed_rank == 1 and "exit code 1" in outcome.reason
    outcome = group(tmp_path, [Ended(-9, order=(4, 0)), Ended(1, order=(3, 0))]).watch(5)
    assert outcome.failed_rank == 1 and "exit code 1" in outcome.reason


def test_ranks_seen_ending_in_one_pump_of_different_servers_tie(tmp_path):
    """Fork servers of different nodes (docker) are pumped in turn: equal orders, so the signal decides."""
    outcome = group(tmp_path, [Ended(1, order=(5, 0)), Ended(-9, order=(5, 0))]).watch(5)
    assert outcome.failed_rank == 1 and "signal 9" in outcome.reason

"""Which rank a failed cell names: the first to die where the launcher knows the order (fork), else one ended by
a signal (a killed rank) before one that exited with an error (its peers, when their connections reset)."""

from __future__ import annotations

from pathlib import Path

from testbed import rankenv
from testbed.fabric.process import PopenLike
from testbed.plan.network import Node
from testbed.runner.ranks import RankGroup, RankSpec
from testbed.steplog import StepLog


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
    watched.held, watched.restarted = set(), {}
    return watched


def test_a_held_ranks_death_neither_fails_the_cell_nor_keeps_it_waiting(tmp_path):
    """A DC's kill under torchft holds its ranks first (RankGroup.hold): their SIGKILL is not a death, and the
    cell is done when the others are; an unheld rank's death still is one."""
    held = group(tmp_path, [Ended(0), Ended(-9), Ended(0)])
    held.hold(1)
    outcome = held.watch(5)
    assert outcome.ok, outcome.reason
    assert group(tmp_path, [Ended(0), Ended(-9), Ended(0)]).watch(5).failed_rank == 1
    waiting = group(tmp_path, [Ended(None), Ended(-9), Ended(0)])
    waiting.hold(1)
    outcome = waiting.watch(0.3)  # rank 0 still running: a timeout names it, not the held rank
    assert not outcome.ok and "timed out" in outcome.reason and outcome.failed_rank == 0


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


def closed_group(tmp_path: Path, code: int, close: bool) -> RankGroup:
    """Rank 0 wrote two steps with StepLog (and closed it when `close`), then ended with `code`; rank 1 exited 0."""
    log = StepLog(tmp_path / "metrics", rank=0)
    log.step(tokens=8)
    log.step(tokens=8)
    if close:
        log.close()
    watched = group(tmp_path, [Ended(code), Ended(0)])
    watched.specs = [RankSpec(s.rank, s.node, 0, {rankenv.METRICS_DIR: str(tmp_path / "metrics")})
                     for s in watched.specs]
    return watched


def test_an_abort_after_the_script_closed_its_step_log_is_teardown_kept_as_a_note(tmp_path):
    """torch's gloo threads outlive destroy_process_group() under DDP: exit() can abort (signal 6) after the work."""
    outcome = closed_group(tmp_path, -6, close=True).watch(5)
    assert outcome.ok and not outcome.died
    assert "rank 0 on east-0 ended by signal 6 (SIGABRT)" in outcome.reason and "2 steps recorded" in outcome.reason


def test_an_abort_before_the_step_log_is_closed_is_a_death(tmp_path):
    outcome = closed_group(tmp_path, -6, close=False).watch(5)
    assert not outcome.ok and outcome.died and outcome.failed_rank == 0 and "signal 6" in outcome.reason


def test_a_kill_after_the_step_log_is_closed_is_a_death(tmp_path):
    outcome = closed_group(tmp_path, -9, close=True).watch(5)
    assert not outcome.ok and outcome.died and "signal 9" in outcome.reason


def test_an_error_exit_after_the_step_log_is_closed_is_a_death(tmp_path):
    assert not closed_group(tmp_path, 1, close=True).watch(5).ok

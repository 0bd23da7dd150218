"""testbed.fabric.parallel.each_at_once: every item at once, results in order, a failure raised after all ended."""

from __future__ import annotations

import threading
import time

import pytest

from testbed.fabric.parallel import each_at_once


def test_every_item_runs_at_once_and_the_results_keep_their_order():
    started = threading.Barrier(4, timeout=5)  # broken (an error) unless all four run at the same time

    def work(item: int) -> int:
        started.wait()
        time.sleep(0.01 * (4 - item))  # the last to finish is the first item
        return item * 10

    assert each_at_once(work, [0, 1, 2, 3]) == [0, 10, 20, 30]


def test_a_failure_is_raised_once_every_other_item_has_ended():
    ended = []

    def work(item: int) -> int:
        if item == 0:
            raise ValueError("host 0: unreachable")
        time.sleep(0.1)
        ended.append(item)
        return item

    with pytest.raises(ValueError, match="host 0"):
        each_at_once(work, [0, 1, 2])
    assert sorted(ended) == [1, 2]


def test_at_most_most_run_together_and_nothing_is_no_work():
    running, peak, lock = 0, 0, threading.Lock()

    def work(item: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return item

    assert each_at_once(work, list(range(6)), most=2) == list(range(6))
    assert peak == 2
    assert each_at_once(work, []) == []

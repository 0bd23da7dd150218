"""The one deadline loop (wait_for) and the process check every waiter uses (no root)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from testbed.waiting import alive, wait_for


def test_it_returns_the_first_true_answer_and_the_last_false_one_at_the_deadline():
    answers = iter([0, "", None, "ready"])
    assert wait_for(lambda: next(answers), 5, interval=0.001) == "ready"
    calls = []
    started = time.monotonic()
    assert wait_for(lambda: calls.append(1) or [], 0.05, interval=0.01) == []
    assert 0.05 <= time.monotonic() - started < 1 and len(calls) >= 3  # asked again at the deadline
    assert wait_for(lambda: calls.append(2) or 0, 0) == 0 and calls[-1] == 2  # asked once, even with no time


def test_a_condition_may_stop_the_wait_by_raising():
    def died() -> bool:
        raise RuntimeError("the process it waited for died")

    with pytest.raises(RuntimeError, match="died"):
        wait_for(died, None)


def test_a_zombie_is_not_alive():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    assert wait_for(lambda: not alive(proc.pid), 10)  # exited, not yet reaped: dead all the same
    assert proc.poll() == 0 and not alive(proc.pid) and not alive(0) and alive(os.getpid())

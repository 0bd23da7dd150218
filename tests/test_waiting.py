"""The one deadline loop (wait_for) and the process check every waiter uses (no root)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from testbed.waiting import alive, parse_stat, proc_stat, wait_for


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


@pytest.mark.parametrize(("line", "state", "start"), [
    ("42 (python3) S 1 42 42 0 -1 4194560 900 0 0 0 5 1 0 0 20 0 1 0 123456 1000 100 18446744073709551615", "S",
     123456),
    ("7 (tmux: server) R 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0 0", "R", 99),  # a space in the name
    ("8 (a) b) (c)) Z 1 8 8 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 77 0 0 0", "Z", 77),  # parentheses in the name
    ("9 ()) X 1 9 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0 0", "X", 5),
])
def test_a_stat_line_gives_state_and_start_whatever_the_command_name(line, state, start):
    stat = parse_stat(line)
    assert (stat.state, stat.start) == (state, start) and stat.running == (state not in "ZX")


@pytest.mark.parametrize("line", ["", "42 python3 S 1", "42 (x) S 1 2 3", "42 (x) S 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 "
                                  "20 0 1 0 soon 0"])
def test_what_is_not_a_stat_line_parses_to_none(line):
    assert parse_stat(line) is None


def test_this_process_started_after_boot_and_before_its_child():
    me, child = proc_stat(os.getpid()), subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert me.running and 0 < me.start <= proc_stat(child.pid).start and proc_stat(-1) is None
    finally:
        child.kill()
        child.wait()

"""A straggler's loop on its rank's node (root, netns): a busy process slowed 4 times for 1 s gets about a quarter of
the CPU it gets unslowed, is continued when the loop ends or is stopped early, and the loop leaves nothing.
(docker and ssh: tests/fabric/test_backends.py runs one in a cell.) The testbed goes with the prefix fixture."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from testbed.fabric import lifecycle
from testbed.runner.straggler import Straggler, duty_cycle
from testbed.waiting import wait_for
from tests.support.topologies import make_topology

pytestmark = pytest.mark.root

BUSY = "while True: pass"
TICKS = os.sysconf("SC_CLK_TCK")


def stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command's name: state first."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_s(pid: int) -> float:
    fields = stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def state(pid: int) -> str:
    return stat(pid)[0]


def busy_share(pid: int, seconds: float) -> float:
    before, start = cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_s(pid) - before) / (time.monotonic() - start)


def test_duty_cycle_splits_each_period():
    assert duty_cycle(4) == pytest.approx((0.075, 0.025))
    assert duty_cycle(1.25) == pytest.approx((0.02, 0.08))


def test_a_straggler_gets_its_share_of_the_cpu_and_is_continued(prefix):
    testbed = lifecycle.bring_up(make_topology("one", {"east": 1}),
                                 prefix=prefix)
    node = testbed.plan.nodes[0].name
    proc = testbed.fabric.popen(node, [sys.executable, "-c", BUSY], start_new_session=True)
    try:
        free = busy_share(proc.pid, 0.5)
        until = time.time() + 1.0
        loop = Straggler(testbed.fabric, node, proc.pid, 4, until)
        slowed = busy_share(proc.pid, 0.8)
        loop._proc.wait(timeout=5)  # it ends by itself, no later than `until` (no period starts that would end after)
        assert time.time() <= until + 0.05 and loop.stop() and state(proc.pid) != "T"
        # a quarter of what it gets unslowed, give or take the loop's forks and this machine's other load
        assert 0.12 <= slowed / free <= 0.40, (free, slowed)

        early = Straggler(testbed.fabric, node, proc.pid, 10, time.time() + 30.0)
        assert wait_for(lambda: state(proc.pid) == "T", 2.0)  # stopped now: stop() must continue it
        began = time.monotonic()
        assert early.stop() and time.monotonic() - began < 1.0  # ended at once
        assert state(proc.pid) != "T" and busy_share(proc.pid, 0.3) > 0.5 * free
        assert loop._proc.poll() is not None and early._proc.poll() is not None  # no loop left running
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()

"""Waiting for something to happen, with a deadline; and whether a process still runs. Standard library only
(the programs inside nodes use it too)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float | None, interval: float = 0.02) -> T:
    """Call `condition` until it returns something true, and return that; after `timeout` seconds (None: never)
    return its last, false, answer. It is always called at least once, and once more at the deadline; it may
    raise to stop waiting early (a process that died, an interrupt)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return result
            time.sleep(min(interval, left))
        else:
            time.sleep(interval)


@dataclass(frozen=True)
class ProcStat:
    """What the waiters read of /proc/PID/stat: the state letter (field 3) and the start time (field 22, clock
    ticks after boot: with the pid it names one process, a pid alone is reused)."""

    state: str
    start: int

    @property
    def running(self) -> bool:
        """Not ended: a zombie (exited, not yet reaped) or a dead task has."""
        return self.state not in ("Z", "X")


def parse_stat(line: str) -> ProcStat | None:
    """One /proc/PID/stat line; None when it is not one. The command name (field 2, in parentheses) may hold
    spaces and parentheses itself: the fields after it are counted from the last ')'."""
    _, paren, rest = line.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 20 or not fields[19].isdigit():
        return None
    return ProcStat(fields[0], int(fields[19]))


def proc_stat(pid: int) -> ProcStat | None:
    """/proc/PID/stat of `pid`, parsed; None when there is no such process."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return parse_stat(stat.read())
    except OSError:
        return None


def alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped) or a missing process counts as dead."""
    stat = proc_stat(pid)
    return stat is not None and stat.running

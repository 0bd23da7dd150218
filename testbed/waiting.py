"""Waiting for something to happen, with a deadline; and whether a process still runs. Standard library only
(the programs inside nodes use it too)."""

from __future__ import annotations

import time
from collections.abc import Callable
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


def alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped) or a missing process counts as dead."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False

"""Real-time priority for the agents whose timing is the measurement (the delay line's worker, the probe's pinger
and echo): SCHED_FIFO for the calling thread, unless the agent's switch variable is 0. Standard library only."""

from __future__ import annotations

import os

from testbed import settings


def fifo(switch: str, priority: int, reset_on_fork: bool = False) -> str:
    """SCHED_FIFO at `priority` for the calling thread unless $`switch` is 0; what it runs as ('fifo' or 'other').
    `reset_on_fork`: what the thread starts (a `tc`, an ssh session) runs as an ordinary process."""
    if not settings.switched_on(switch):
        return "other"
    policy = os.SCHED_FIFO | (os.SCHED_RESET_ON_FORK if reset_on_fork else 0)
    try:
        os.sched_setscheduler(0, policy, os.sched_param(priority))
    except OSError:  # no CAP_SYS_NICE, or an RT budget of 0 (some containers): run as before
        return "other"
    return "fifo"

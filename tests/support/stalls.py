"""A watch on the machine's own stalls, beside a test whose bound is the code's punctuality.

A process of its own (its own GIL: the code under test holding this process's GIL is the code's lateness, not the
machine's) runs SCHED_FIFO at the top priority and wakes every STEP_S; each wake-up that comes more than
THRESHOLD_S late is a stall, kept as (from, to) on the wall clock. Inside user-mode Linux, a stall is time the host
did not run UML's one CPU (a hypervisor's steal, the host's own interrupts, a host process of higher priority), or
UML's kernel busy where nothing can preempt it (a fork and exec of `tc` held it 30-50 ms, 2026-12-06): time no
process of the test could use. A bound that excuses only what this watch measured, in the same
window, stays a bound on the code."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

STEP_S = 0.01  # one wake-up each (inside UML each costs a few ptrace round trips: 100 a second is little)
THRESHOLD_S = 0.02  # later than this is a stall (UML's timer tick is 10 ms: a wake-up may wait that long)

_WATCH = f"""
import json, os, select, sys, time
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(os.sched_get_priority_max(os.SCHED_FIFO)))
    scheduling = "fifo"
except OSError:
    scheduling = "other"
print(scheduling, flush=True)
stalls, last = [], time.time()
while True:
    ready, _, _ = select.select([sys.stdin], [], [], {STEP_S})
    now = time.time()
    if now - last > {STEP_S} + {THRESHOLD_S}:
        stalls.append((last + {STEP_S}, now))
    last = now
    if ready:
        break
print(json.dumps(stalls), flush=True)
"""


@dataclass
class Stalls:
    """What the watch saw: its scheduling ('fifo' or 'other') and, once it ended, each stall (from, to)."""

    scheduling: str = ""
    spans: list[tuple[float, float]] = field(default_factory=list)

    def within(self, start: float, end: float) -> float:
        """Seconds of stall that overlap [start, end] (wall clock)."""
        return sum(max(0.0, min(end, to) - max(start, since)) for since, to in self.spans)


@contextmanager
def watched() -> Iterator[Stalls]:
    """Watch for stalls for the block; the Stalls' spans are filled in when it ends."""
    stalls = Stalls()
    proc = subprocess.Popen([sys.executable, "-c", _WATCH], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        stalls.scheduling = proc.stdout.readline().strip()
        yield stalls
    finally:
        out, _ = proc.communicate("end\n", timeout=30)
        stalls.spans = [tuple(span) for span in json.loads(out or "[]")]

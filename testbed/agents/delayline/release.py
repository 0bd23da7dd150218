"""When the delay line releases each packet, as pure logic (no sockets, no clock): tested on its own.

Every packet is due latency + U(-jitter, +jitter) after it arrived, never below zero and never before the packet
ahead of it (FIFO: no reordering, like netem with a rate); loss drops each one independently.

The delay line's own path (waking up for a packet, the verdict, the kernel's re-injection) takes time that the
link does not ask for. Each direction measures it as it runs: for packets it could wait for, how long after the
moment it aimed at each one its verdict went out (its wake-up and its own work). It aims that much (the median,
`compensation`) before each packet's due time, so that the packet leaves when due. The verdict call itself is not
taken back: the kernel re-injects the packet inside it and carries it on through whatever it does next at once
(the peer's veth, a bridge, the receiver's stack), which the unshaped path does too; taking that back released
packets early (a docker ping of a 10 ms link came back in 19.69 ms for 20 configured). A packet whose due time has passed by the time
the worker sees it (a delay below `least`: the worker's own reaction) cannot be compensated and leaves as soon as
it can. Each release records its residual, when its verdict is back (sent + the call's running time) against its
due time (negative: early), in a histogram of LATE_BUCKET-wide buckets (`late`). A direction with nothing to do
(no delay, jitter or loss) is not queued at all (supervisor.py): the delay line's path is then not in the way."""

from __future__ import annotations

import random
import statistics
from bisect import bisect_left, insort
from collections import deque

LATE_BUCKET = 1e-5  # seconds per bucket of the residual histogram (10 us)
BIAS = 1 << 20  # buckets added before int() truncates and taken off after: a floor, for early (negative) ones too
SAMPLES = 255  # the most recent path-time samples the compensation is the median of
REESTIMATE_EVERY = 16  # samples between two estimates
VERDICT_WEIGHT = 0.05  # weight of the newest verdict call in their running time
MAX_COMPENSATION = 0.002  # a path time above this is the machine stalling, not the delay line's path


class Direction:
    """One delayed direction: which packets to drop, when each is due, what to release at a given time, how long
    its own path takes (and so how early to aim), and how late each packet went on its way."""

    def __init__(self, queue: int, latency: float, jitter: float, loss: float, rng: random.Random,
                 compensation: float = 0.0) -> None:
        self.queue = queue
        self.latency, self.jitter, self.loss = latency, jitter, loss
        self.rng = rng
        self.fifo: list[tuple[float, float, int, bool]] = []  # (aim, due, packet id, waited for) in arrival order
        self.head = 0
        self.last_due = 0.0
        self.late: dict[int, int] = {}  # residual bucket -> packets that went on their way that late
        self.released = 0
        self.warmed = 0  # warm-ups before a release: verdicts that accepted nothing (the worker's, after a sleep)
        self.woke_late = 0  # releases after a sleep that ended past their aim: no time to warm (the host's timers)
        self.cold = 0  # releases after a sleep that ended in time, not warmed (with warm-ups on: a miss)
        self.compensate = True  # False: aim at the due time itself (what the delay line did before)
        self.compensation = compensation  # seconds before its due time a packet is aimed at
        self.path: deque[float] = deque(maxlen=SAMPLES)  # on its way - aim, for packets it waited for
        self._ranked: list[float] = []  # the same samples in order: a median without sorting them again
        self.reaction: deque[float] = deque(maxlen=SAMPLES)  # seen - arrival: how soon the worker has a packet
        self._fresh = 0
        self._aimed: tuple[float, bool] | None = None  # the newest released packet's (aim, waited for)
        self.verdict = 0.0  # running time a verdict call takes (seconds): a packet is on its way that long after

    def configure(self, latency: float, jitter: float, loss: float) -> None:
        self.latency, self.jitter, self.loss = latency, jitter, loss

    def admit(self, packet_id: int, arrival: float, seen: float | None = None) -> bool:
        """Queue a packet that arrived at `arrival` (the kernel's receive time) and that the worker has since
        `seen` (default: at once); False: drop it (loss)."""
        if self.loss and self.rng.random() < self.loss:
            return False
        delay = self.latency
        if self.jitter:
            delay = max(0.0, delay + self.rng.uniform(-self.jitter, self.jitter))
        due = max(arrival + delay, self.last_due)
        self.last_due = due
        seen = arrival if seen is None else seen
        aim = due - self.compensation if self.compensate else due
        self.fifo.append((aim, due, packet_id, aim > seen))
        return True

    def saw(self, arrival: float, seen: float) -> None:
        """A sample of the worker's reaction: a packet that arrived at `arrival` was seen at `seen`."""
        self.reaction.append(seen - arrival)

    def release(self, now: float, slack: float = 0.0) -> int | None:
        """The id of the last packet aimed by `now + slack` (all before it are released too: the verdict goes out
        now), or None; records each released packet's residual (now + the verdict call's running time - due)."""
        fifo, head, late = self.fifo, self.head, self.late
        last = None
        aim = waited = None
        out = now + self.verdict
        while head < len(fifo) and fifo[head][0] <= now + slack:
            aim, due, last, waited = fifo[head]
            bucket = int((out - due) / LATE_BUCKET + 1e-6 + BIAS) - BIAS  # floor (rounding error aside)
            late[bucket] = late.get(bucket, 0) + 1
            head += 1
        if last is not None:
            self.released += head - self.head
            self._aimed = (aim, waited)
        if head > 1024 and head * 2 > len(fifo):
            del fifo[:head]
            head = 0
        self.head = head
        return last

    def settle(self, sent: float, done: float) -> None:
        """The verdict of what release() last returned was sent at `sent` and came back at `done` (the kernel has
        re-injected the packets by then): if the worker waited for the newest of them, sample the path, sent - its
        aim (what the call carries on is the unshaped path's too: see the module's docstring)."""
        self.verdict += VERDICT_WEIGHT * ((done - sent) - self.verdict)
        if self._aimed is None:
            return
        aim, waited = self._aimed
        self._aimed = None
        if waited and sent - aim < MAX_COMPENSATION:
            self._sample(sent - aim)

    def _sample(self, path: float) -> None:
        ranked = self._ranked
        if len(self.path) == SAMPLES:  # the oldest leaves both
            del ranked[bisect_left(ranked, self.path[0])]
        self.path.append(path)
        insort(ranked, path)
        self._fresh += 1
        if self._fresh >= REESTIMATE_EVERY or len(ranked) < REESTIMATE_EVERY:
            self._fresh = 0
            middle = len(ranked) // 2  # statistics.median's: the middle one, or the mean of the two middle ones
            self.compensation = ranked[middle] if len(ranked) % 2 else (ranked[middle - 1] + ranked[middle]) / 2

    def least(self) -> float | None:
        """The shortest delay this direction can give (seconds): the worker's median reaction to a packet; a
        configured delay below it plus the compensation cannot be compensated. None before any packet."""
        return statistics.median(self.reaction) + max(0.0, self.compensation) if self.reaction else None

    def next_due(self) -> float | None:
        """When the head packet is aimed to leave (its due time less the compensation)."""
        return self.fifo[self.head][0] if self.head < len(self.fifo) else None

    def before_head(self) -> int:
        """The packet id just below the head's, for a verdict that accepts nothing: every packet still in the kernel
        is the head or after it. (Not 0: the kernel compares ids modulo 2**32, so once a queue has numbered 2**31
        packets, a verdict up to 0 would accept every held packet.) Only while a packet is held."""
        return (self.fifo[self.head][2] - 1) & 0xFFFFFFFF

    def figures(self) -> dict:
        """What the stats file says of this direction beside the histogram: the path's figures, in ms."""
        least = self.least()
        return {"latency_ms": self.latency * 1e3, "compensation_ms": self.compensation * 1e3 if self.compensate else 0.0,
                "path_ms": statistics.median(self.path) * 1e3 if self.path else None,
                "least_ms": least * 1e3 if least is not None else None, "compensating": self.compensate}


def lateness_summary(late: dict, packets: int | None = None) -> dict:
    """p50, p99 and max residual (ms; negative: early) of a histogram {bucket: packets} (keys may be strings, from
    JSON)."""
    counts = sorted((int(bucket), count) for bucket, count in late.items() if count > 0)
    total = sum(count for _, count in counts)
    out = {"packets": total if packets is None else packets, "p50_ms": None, "p99_ms": None, "max_ms": None}
    if not total:
        return out
    for name, q in (("p50_ms", 0.5), ("p99_ms", 0.99)):
        rank, seen = q * total, 0
        for bucket, count in counts:
            seen += count
            if seen >= rank:
                out[name] = bucket * LATE_BUCKET * 1e3
                break
    out["max_ms"] = counts[-1][0] * LATE_BUCKET * 1e3
    return out


def lateness_delta(before: dict, after: dict) -> dict:
    """What one direction's histogram gained between two stats snapshots (a restarted worker starts again)."""
    if not before or before.get("worker") != after.get("worker"):
        return dict(after.get("late", {}))
    old = before.get("late", {})
    return {bucket: count - old.get(bucket, 0) for bucket, count in after.get("late", {}).items()
            if count - old.get(bucket, 0) > 0}

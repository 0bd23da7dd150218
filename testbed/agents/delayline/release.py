"""When the delay line releases each packet, as pure logic (no sockets, no clock): tested on its own.

Every packet is held latency + U(-jitter, +jitter), never below zero and never before the packet ahead of it
(FIFO: no reordering, like netem with a rate); loss drops each one independently. Each release records how
late it was against its due time, in a histogram of LATE_BUCKET-wide buckets."""

from __future__ import annotations

import random

LATE_BUCKET = 1e-5  # seconds per bucket of the lateness histogram (10 us)


class Direction:
    """One delayed direction: which packets to drop, when each is due, what to release at a given time, and
    how late each release was."""

    def __init__(self, queue: int, latency: float, jitter: float, loss: float, rng: random.Random) -> None:
        self.queue = queue
        self.latency, self.jitter, self.loss = latency, jitter, loss
        self.rng = rng
        self.fifo: list[tuple[float, int]] = []  # (due, packet id) in arrival order
        self.head = 0
        self.last_due = 0.0
        self.late: dict[int, int] = {}  # lateness bucket -> packets released that late
        self.released = 0

    def configure(self, latency: float, jitter: float, loss: float) -> None:
        self.latency, self.jitter, self.loss = latency, jitter, loss

    def admit(self, packet_id: int, arrival: float) -> bool:
        """Queue a packet that arrived at `arrival`; False: drop it (loss)."""
        if self.loss and self.rng.random() < self.loss:
            return False
        delay = self.latency
        if self.jitter:
            delay = max(0.0, delay + self.rng.uniform(-self.jitter, self.jitter))
        due = max(arrival + delay, self.last_due)
        self.last_due = due
        self.fifo.append((due, packet_id))
        return True

    def release(self, now: float, slack: float = 0.0) -> int | None:
        """The id of the last packet due by `now + slack` (all before it are released too), or None;
        records each released packet's lateness, now - due (early releases within the slack count as 0)."""
        fifo, head, late = self.fifo, self.head, self.late
        last = None
        while head < len(fifo) and fifo[head][0] <= now + slack:
            due, last = fifo[head]
            bucket = int((now - due) / LATE_BUCKET) if now > due else 0
            late[bucket] = late.get(bucket, 0) + 1
            head += 1
        if last is not None:
            self.released += head - self.head
        if head > 1024 and head * 2 > len(fifo):
            del fifo[:head]
            head = 0
        self.head = head
        return last

    def next_due(self) -> float | None:
        return self.fifo[self.head][0] if self.head < len(self.fifo) else None


def lateness_summary(late: dict, packets: int | None = None) -> dict:
    """p50, p99 and max lateness (ms) of a histogram {bucket: packets} (keys may be strings, from JSON)."""
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

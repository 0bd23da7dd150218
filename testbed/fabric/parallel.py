"""Work on every host, container or router at once: each has a connection of its own, and most of the time is
spent waiting on it."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def each_at_once(work: Callable[[T], R], items: list[T], most: int | None = None) -> list[R]:
    """work(item) for every item at once, one thread each (at most `most` at a time); the results in order. The
    first failure is raised once every thread has ended."""
    with ThreadPoolExecutor(max_workers=max(1, min(len(items), most or len(items)))) as pool:
        jobs = [pool.submit(work, item) for item in items]
        return [job.result() for job in jobs]

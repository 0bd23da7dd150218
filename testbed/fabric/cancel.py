"""Cooperative cancellation: SIGINT/SIGTERM set a flag that long operations check between steps.

A KeyboardInterrupt raised from a signal handler can land inside a library's event loop and be swallowed
there; a flag checked at safe points cannot be lost.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

_requested = threading.Event()


def check() -> None:
    """Raise KeyboardInterrupt if a stop was requested."""
    if _requested.is_set():
        raise KeyboardInterrupt


def requested() -> bool:
    return _requested.is_set()


def reset() -> None:
    """Forget a stop that the caller has handled (a benchmark that stopped one run and goes on)."""
    _requested.clear()


def install() -> None:
    """Route SIGINT and SIGTERM to the flag (and an immediate KeyboardInterrupt) in this process only.

    Forked helpers (pyroute2 forks for netns work) inherit handlers; for them a signal stays plain
    termination.
    """
    main_pid = os.getpid()

    def handler(signum: int, frame: Any) -> None:
        if os.getpid() != main_pid:
            os._exit(128 + signum)
        _requested.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)

"""Whether this machine's kernel has netem (tried in a throwaway namespace), and the shaper `auto` stands for."""

from __future__ import annotations

import functools
import os

from pyroute2 import NetNS, netns

from testbed.agents.kernel import netem_on
from testbed.fabric.errors import FabricError


@functools.lru_cache(maxsize=1)
def netem_support() -> tuple[bool, str]:
    """(available, reason) for this host's kernel, tried in a throwaway namespace."""
    name = f"tb-netem-check-{os.getpid()}"
    netns.create(name)
    try:
        with NetNS(name) as ns:
            return netem_on(ns)
    finally:
        netns.remove(name)


def has_netem() -> bool:
    return netem_support()[0]


def resolve_shaper(requested: str) -> str:
    """'auto' -> 'netem' where the kernel has it, else 'userspace-delay'; explicit names are checked."""
    if requested == "auto":
        return "netem" if has_netem() else "userspace-delay"
    if requested == "netem":
        ok, reason = netem_support()
        if not ok:
            raise FabricError(f"shaper netem requested but {reason}; use --shaper auto or userspace-delay")
    return requested

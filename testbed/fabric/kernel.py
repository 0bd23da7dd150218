"""Facts about the running kernel that decide how links are shaped."""

from __future__ import annotations

import functools
import os

from pyroute2 import NetlinkError, NetNS, netns


@functools.lru_cache(maxsize=1)
def netem_support() -> tuple[bool, str]:
    """(available, reason): try a netem qdisc on the loopback of a throwaway namespace."""
    name = f"tb-netem-check-{os.getpid()}"
    netns.create(name)
    try:
        with NetNS(name) as ns:
            ns.link("set", index=1, state="up")
            try:
                ns.tc("add", "netem", index=1, handle=0x10000, delay=1000)
            except NetlinkError as error:
                return False, f"this kernel has no sch_netem ({os.strerror(error.code)})"
            return True, "sch_netem available"
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
            from testbed.fabric.base import FabricError

            raise FabricError(f"shaper netem requested but {reason}; use --shaper auto or userspace-delay")
    return requested

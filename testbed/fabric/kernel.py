"""Facts about the running kernel that decide how links are shaped, and one line when a feature is missing."""

from __future__ import annotations

import errno
import functools
import os
from contextlib import contextmanager
from typing import Iterator

from pyroute2 import NetlinkError, NetNS, netns
from pyroute2.netlink.rtnl import TC_H_ROOT

from testbed.fabric.base import FabricError

MISSING = (errno.EOPNOTSUPP, errno.ENOENT, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT)  # what an absent module says


@contextmanager
def needs(feature: str, doing: str) -> Iterator[None]:
    """Turn the kernel's answer for a missing module or config option into one line naming the feature."""
    try:
        yield
    except (NetlinkError, OSError) as error:
        code = error.code if isinstance(error, NetlinkError) else error.errno
        if code not in MISSING:
            raise
        raise FabricError(f"this kernel lacks {feature}: {doing} failed ({os.strerror(code)})") from None


def netem_on(handle) -> tuple[bool, str]:
    """(available, reason): add a netem qdisc on loopback through `handle` (a pyroute2 IPRoute or NetNS of a
    namespace we own: a throwaway one here, a docker router's own) and remove it again."""
    handle.link("set", index=1, state="up")
    try:
        handle.tc("add", "netem", index=1, handle=0x10000, delay=1000)
    except NetlinkError as error:
        return False, f"this kernel has no sch_netem ({os.strerror(error.code)})"
    handle.tc("del", index=1, handle=0x10000, parent=TC_H_ROOT)  # a root qdisc is deleted by its parent
    return True, "sch_netem available"


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

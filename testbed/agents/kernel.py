"""What the kernel a link end is built on lacks: one line naming the missing feature, and whether it has netem.

Shared by the netns backend (on this machine's kernel) and the docker router agent (on the docker host's)."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyroute2 import NetlinkError
from pyroute2.netlink.rtnl import TC_H_ROOT

MISSING = (errno.EOPNOTSUPP, errno.ENOENT, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT)  # what an absent module says


class KernelLacks(RuntimeError):
    """The kernel lacks a module or config option; str() is one line naming it."""


@contextmanager
def needs(feature: str, doing: str) -> Iterator[None]:
    """Turn the kernel's answer for a missing module or config option into one line naming the feature."""
    try:
        yield
    except (NetlinkError, OSError) as error:
        code = error.code if isinstance(error, NetlinkError) else error.errno
        if code not in MISSING:
            raise
        raise KernelLacks(f"this kernel lacks {feature}: {doing} failed ({os.strerror(code)})") from None


def netem_on(handle: Any) -> tuple[bool, str]:
    """(available, reason): add a netem qdisc on loopback through `handle` (a pyroute2 IPRoute or NetNS of a
    namespace we own: a throwaway one, a docker router's own) and remove it again."""
    handle.link("set", index=1, state="up")
    try:
        handle.tc("add", "netem", index=1, handle=0x10000, delay=1000)
    except NetlinkError as error:
        return False, f"this kernel has no sch_netem ({os.strerror(error.code)})"
    handle.tc("del", index=1, handle=0x10000, parent=TC_H_ROOT)  # a root qdisc is deleted by its parent
    return True, "sch_netem available"

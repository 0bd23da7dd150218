"""`python -m testbed.fabric.nsexec NETNS -- ARGV...`: run ARGV inside a named network namespace.

A tiny exec helper (ctypes setns + execvp) so that library code never shells out to `ip netns exec` and
never calls setns between fork and exec of a threaded parent.
"""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWNET = 0x40000000
NETNS_RUN_DIR = "/run/netns"


def enter(name: str) -> None:
    """Move the calling thread into network namespace `name` (a file under /run/netns)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join(NETNS_RUN_DIR, name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def argv_in(name: str, argv: list[str]) -> list[str]:
    """The command line that runs `argv` inside namespace `name`."""
    return [sys.executable, "-m", "testbed.fabric.nsexec", name, "--", *argv]


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m testbed.fabric.nsexec NETNS -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    try:
        enter(args[0])
        os.execvp(args[2], args[2:])
    except OSError as error:
        print(f"nsexec: {args[0]}: {args[2]}: {error.strerror or error}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

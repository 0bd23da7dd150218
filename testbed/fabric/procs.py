"""Process facts shared by the fabric and the delay line (standard library only: the delay line imports it)."""

from __future__ import annotations


def alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped) or a missing process counts as dead."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False

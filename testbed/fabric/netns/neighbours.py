"""The host's ARP table limits, raised for a big testbed and put back when the last testbed that needed them is
gone. Neighbour entries of every namespace count against one host-wide table (gc_thresh3 is its hard limit,
1024 by default): with more entries than that, connects inside a DC fail with "No route to host".

What was raised is recorded before the sysctls change, in a host-wide file (not the state directory: the limit
is the host's, whichever state directory a testbed uses), with the prefixes of the testbeds that need it;
`down` and `clean` of the last of them restore the original values, unless someone else has changed them since.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from testbed import settings
from testbed.atomic import write_text

NEIGH = Path("/proc/sys/net/ipv4/neigh/default")
RECORD = Path(os.environ.get(settings.NEIGH_RECORD, "/run/testbed-neighbour-limits.json"))
NAMES = ("gc_thresh2", "gc_thresh3")


def neighbour_entries(dc_sizes: list[int], links: int) -> int:
    """ARP entries a testbed may hold at once: in each DC every node and the gateway may know all the others,
    and each inter-DC link's two gateways know each other."""
    return sum((n + 1) * n for n in dc_sizes) + 2 * links


def _read(neigh: Path) -> dict[str, int]:
    return {name: int((neigh / name).read_text()) for name in NAMES}


def _write(neigh: Path, values: dict[str, int]) -> None:
    for name in ("gc_thresh3", "gc_thresh2") if values["gc_thresh3"] >= _read(neigh)["gc_thresh3"] else NAMES:
        (neigh / name).write_text(str(values[name]))  # thresh2 <= thresh3 at every moment


def _load(record: Path) -> dict | None:
    try:
        return json.loads(record.read_text())
    except (OSError, ValueError):
        return None


@contextmanager
def _locked(record: Path) -> Iterator[None]:
    """One testbed at a time reads and writes the record (its directory is the lock: no lock file to leave)."""
    fd = os.open(record.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def ensure_neighbour_capacity(entries: int, prefix: str, *, neigh: Path = NEIGH,
                              record: Path = RECORD) -> str | None:
    """Raise the limits to twice `entries` where they are lower, for testbed `prefix`; what was changed, in
    words (None: nothing). A testbed that needs limits another one raised is recorded as needing them too."""
    with _locked(record):
        return _ensure(2 * entries, prefix, neigh, record)


def _ensure(want: int, prefix: str, neigh: Path, record: Path) -> str | None:
    current = _read(neigh)
    held = _load(record)
    if current["gc_thresh3"] >= want:
        if held and want > held["original"]["gc_thresh3"] and prefix not in held["users"]:
            held["users"].append(prefix)
            write_text(record, json.dumps(held))
        return None
    raised = {"gc_thresh3": want, "gc_thresh2": max(current["gc_thresh2"], want // 2)}
    original = held["original"] if held else current
    users = sorted(set((held or {}).get("users", [])) | {prefix})
    write_text(record, json.dumps({"original": original, "raised": raised, "users": users}))  # first
    _write(neigh, raised)
    return (f"raised the host's ARP table limit (net.ipv4.neigh.default.gc_thresh3) from {current['gc_thresh3']} "
            f"to {want} until the testbed is down")


def release_neighbour_capacity(prefix: str, *, neigh: Path = NEIGH, record: Path = RECORD) -> str | None:
    """Testbed `prefix` is gone: when no testbed needs the raised limits any more, put the original values back
    (left alone if they were changed since by someone else); what was done, in words (None: nothing)."""
    with _locked(record):
        return _release(prefix, neigh, record)


def _release(prefix: str, neigh: Path, record: Path) -> str | None:
    held = _load(record)
    if not held or prefix not in held["users"]:
        return None
    held["users"].remove(prefix)
    if held["users"]:
        write_text(record, json.dumps(held))
        return None
    record.unlink(missing_ok=True)
    if _read(neigh) != held["raised"]:
        return None
    _write(neigh, held["original"])
    return f"restored the host's ARP table limit (gc_thresh3) to {held['original']['gc_thresh3']}"

"""What each host has and lacks before a run: python, torch, tc, netem, clock offset."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from testbed.fabric.ssh.connection import Connection, RemoteError
from testbed.spec.inventory import Inventory

NETEM_PROBE = ("import os, sys\n"  # loaded, built in, or a module the kernel can load on first use
               "names = [l.split()[0] for l in open('/proc/modules')] if os.path.exists('/proc/modules') else []\n"
               "ok = os.path.isdir('/sys/module/sch_netem') or 'sch_netem' in names\n"
               "for name in ('modules.dep', 'modules.builtin'):\n"
               "    path = '/lib/modules/%s/%s' % (os.uname().release, name)\n"
               "    ok = ok or (os.path.exists(path) and 'sch_netem.ko' in open(path).read())\n"
               "sys.stdout.write('yes' if ok else 'no')")


@dataclass
class HostCheck:
    dc: str
    host: str
    address: str
    reachable: bool
    python: str = ""
    torch: str = ""
    tc: str = ""
    netem: str = ""
    clock_offset_ms: float | None = None
    problems: str = ""


def clock_offset_ms(connection: Connection) -> float | None:
    """The host's clock minus ours, from the host's time read halfway through a round trip (NTP's estimate).

    `date` starts in about a millisecond; a Python there took half its start-up into the figure (0.5 s and more
    on a loaded host, which failed the ssh tests' bound of 1 s right after other runs)."""
    before = time.time()
    out = connection.run(["date", "+%s.%N"])
    after = time.time()
    try:
        return (float(out.stdout) - (before + after) / 2) * 1e3 if out.code == 0 else None
    except ValueError:  # a `date` without %N (busybox): no offset rather than a wrong one
        return None


def check_host(dc: str, connection: Connection) -> HostCheck:
    host = connection.host
    result = HostCheck(dc, host.name, host.address, True)
    problems = []
    out = connection.run([host.python, "-c", "import sys; print(sys.version.split()[0])"])
    result.python = out.stdout.strip() if out.code == 0 else "missing"
    if out.code != 0:
        problems.append(f"{host.python} not found")
    out = connection.run([host.python, "-c", "import torch; print(torch.__version__)"])
    result.torch = out.stdout.strip() if out.code == 0 else "missing"
    if out.code != 0:
        problems.append("torch not importable")
    out = connection.run(["tc", "-V"])
    result.tc = out.stdout.strip().split()[-1] if out.code == 0 and out.stdout.strip() else "missing"
    if out.code != 0:
        problems.append("tc (iproute2) missing")
    out = connection.run([host.python, "-c", NETEM_PROBE])
    result.netem = out.stdout.strip() or "unknown"
    result.clock_offset_ms = clock_offset_ms(connection)
    result.problems = "; ".join(problems)
    return result


def check_inventory(inventory: Inventory, base: Path, known_hosts: Path, accept_new: bool) -> list[HostCheck]:
    """Check every host; an unreachable host is a row with its one-line reason, not an exception."""
    rows = []
    for dc, host in inventory.hosts():
        try:
            with Connection(host, host.key_path(base), known_hosts, accept_new) as connection:
                rows.append(check_host(dc, connection))
        except RemoteError as error:
            rows.append(HostCheck(dc, host.name, host.address, False, problems=str(error)))
    return rows

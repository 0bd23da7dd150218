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


def clock_offset_ms(connection: Connection, samples: int = 3) -> float | None:
    """The host's clock minus ours, from the host's time read halfway through a round trip (NTP's estimate),
    through the host's kept-open shell, the shortest of `samples` round trips.

    Read by a new SSH command, the host's time came after the session's set-up (sshd, the login shell and its rc
    files: 0.1-0.5 s here), half of which went into the figure: 79-238 ms on one host with one clock; through
    the shell opened first, -1.3 to +0.5 ms."""
    try:
        connection.open_shell()  # the session's set-up, outside the measured round trips
        best: tuple[float, float] | None = None
        for _ in range(samples):
            before = time.time()
            out = connection.script(["date +%s.%N"])
            after = time.time()
            if out.code != 0:
                return None
            sample = (after - before, (float(out.stdout) - (before + after) / 2) * 1e3)
            best = sample if best is None or sample[0] < best[0] else best
    except RemoteError:
        return None
    except ValueError:  # a `date` without %N (busybox): no offset rather than a wrong one
        return None
    return best[1] if best else None


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

"""What each host has and lacks before a run: python, torch, tc, netem, clock offset."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.fabric.parallel import each_at_once
from testbed.fabric.ssh.connection import Connection, RemoteError
from testbed.spec.inventory import HostSpec, Inventory

MAX_PARALLEL_CHECKS = 32  # hosts checked at once (one SSH connection and one python each)

HOST_PROBE = ("import json, os, sys\n"  # one python start per host: its version, torch's, and netem
              "found = {'python': sys.version.split()[0], 'torch': ''}\n"
              "try:\n"
              "    import torch\n"
              "    found['torch'] = torch.__version__\n"
              "except Exception as error:\n"
              "    found['torch_error'] = '%s: %s' % (type(error).__name__, error)\n"
              "# netem: loaded, built in, or a module the kernel can load on first use\n"
              "names = [l.split()[0] for l in open('/proc/modules')] if os.path.exists('/proc/modules') else []\n"
              "ok = os.path.isdir('/sys/module/sch_netem') or 'sch_netem' in names\n"
              "for name in ('modules.dep', 'modules.builtin'):\n"
              "    path = '/lib/modules/%s/%s' % (os.uname().release, name)\n"
              "    ok = ok or (os.path.exists(path) and 'sch_netem.ko' in open(path).read())\n"
              "found['netem'] = 'yes' if ok else 'no'\n"
              "sys.stdout.write('\\n' + json.dumps(found))")


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
    out = connection.run([host.python, "-c", HOST_PROBE])
    try:
        found = json.loads(out.stdout.strip().splitlines()[-1]) if out.code == 0 else {}
    except (IndexError, ValueError):
        found = {}
    result.python = found.get("python", "missing")
    result.torch = found.get("torch") or "missing"
    result.netem = found.get("netem", "unknown")
    if not found:
        said = (out.stderr.strip() or out.stdout.strip()).splitlines()[-1:] or [f"exit code {out.code}"]
        problems.append(f"{host.python} not found" if out.code == 127 else f"{host.python} failed: {said[0]}")
    elif not found.get("torch"):
        problems.append(f"torch not importable ({found.get('torch_error', '')})")
    out = connection.run(["tc", "-V"])
    result.tc = out.stdout.strip().split()[-1] if out.code == 0 and out.stdout.strip() else "missing"
    if out.code != 0:
        problems.append("tc (iproute2) missing")
    result.clock_offset_ms = clock_offset_ms(connection)
    result.problems = "; ".join(problems)
    return result


def _check_one(dc: str, host: HostSpec, base: Path, known_hosts: Path, accept_new: bool) -> HostCheck:
    try:
        with Connection(host, host.key_path(base), known_hosts, accept_new) as connection:
            return check_host(dc, connection)
    except RemoteError as error:
        return HostCheck(dc, host.name, host.address, False, problems=str(error))


def check_inventory(inventory: Inventory, base: Path, known_hosts: Path, accept_new: bool) -> list[HostCheck]:
    """Check every host, all at once (each waits mostly on its own torch import: the four test hosts, sharing
    this machine's 2 cores, took 12.1 s one after the other, 6.4-7.4 s together), rows in inventory order; an
    unreachable host is a row with its one-line reason, not an exception."""
    return each_at_once(lambda pair: _check_one(*pair, base, known_hosts, accept_new), inventory.hosts(),
                        most=MAX_PARALLEL_CHECKS)

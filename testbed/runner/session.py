"""What every run does around its cells, whatever runs in them (an experiment, a user's command, a scale model):
hold a prefix of its own, bring its testbed up and always down, note the other testbeds that share this machine's
cores, and close the manifest (every cell's link calibration, the end time, those testbeds)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from testbed.atomic import write_text as atomic_write
from testbed.fabric.backend import Backend
from testbed.fabric.lifecycle import Testbed, bring_up, tear_down
from testbed.fabric.ownership import Owner, claim, claim_free, live_owners
from testbed.plan import DEFAULT_PREFIX


def hold(prefix: str | None) -> str:
    """Hold the run's prefix before anything is written: the one given, or one of its own that nobody holds."""
    if prefix:
        claim(prefix, "another testbed does not come up under its prefix")
        return prefix
    return claim_free(DEFAULT_PREFIX, "it is not touched while that run lives")


def note_beside(beside: dict[str, Owner], prefix: str) -> None:
    """Add the testbeds other live processes hold now (they share this machine's cores) to `beside`."""
    for owner in live_owners():
        if owner.prefix != prefix:
            beside.setdefault(f"{owner.prefix} {owner.pid}", owner)


def shared_host(beside: dict[str, Owner]) -> list[dict]:
    """The manifest's `shared_host`: the other testbeds seen held on this machine during the run (at its start,
    before each cell and at its end): their prefix, pid, command and start. Empty: the run had the machine's
    cores to itself, as far as testbeds go."""
    return [{"prefix": o.prefix, "pid": o.pid, "command": o.command, "started": o.started} for o in beside.values()]


@contextmanager
def fabric(topology, topology_file: Path, prefix: str, shaper: str, backend: str | Backend) -> Iterator[Testbed]:
    """The testbed for a run, torn down whatever happens (also Ctrl-C or a failed cell)."""
    testbed = bring_up(topology, prefix=prefix, shaper=shaper, topology_file=topology_file, backend=backend)
    try:
        yield testbed
    finally:
        tear_down(prefix)


def finish_run(run_dir: Path, shared: list[dict] | None = None) -> Path:
    """Add every cell's link calibration, the end time and (given) the other testbeds seen on this machine
    during the run to the manifest."""
    path = run_dir / "manifest.json"
    data = json.loads(path.read_text())
    if shared is not None:
        seen = {(o["prefix"], o["pid"]) for o in data.get("shared_host", [])}
        data["shared_host"] = data.get("shared_host", []) + [o for o in shared if (o["prefix"], o["pid"]) not in seen]
    results = sorted((json.loads(p.read_text()) for p in (run_dir / "cells").glob("*/result.json")),
                     key=lambda result: result.get("started", 0.0))
    data["calibration"] = {r["cell"]["id"]: r.get("calibration", []) for r in results}
    data["finished"] = datetime.now(UTC).isoformat()
    atomic_write(path, json.dumps(data, indent=1))
    return run_dir

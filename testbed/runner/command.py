"""Bring your own workload: a user's command run as every rank across the emulated DCs, as one cell (and an
unshaped baseline before it), with the same env, logs, counters and manifest as an experiment."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from testbed.atomic import write_text as atomic_write
from testbed.fabric import cancel, registry
from testbed.fabric.backend import Backend
from testbed.fabric.ownership import Owner, release
from testbed.runner.cell import run_cell
from testbed.runner.cells import UNSHAPED, Cell, base_links
from testbed.runner.manifest import manifest
from testbed.runner.ranks import command_env
from testbed.runner.session import fabric, finish_run, hold, note_beside, shared_host
from testbed.runner.space import cell_bytes, check_room, failed_for_room, room_for_cell, run_bytes, stop_when_full
from testbed.spec.experiment import Experiment
from testbed.spec.topology import load_topology


def run_command(topology_path: Path, command: list[str], out_root: Path, *, prefix: str | None = None,
                shaper: str = "auto",
                ranks_per_node: int = 1, timeout: float = 3600, progress: Any = None,
                backend: str | Backend = registry.DEFAULT, baseline: bool = False, warmup_steps: int = 2,
                tokens_per_step: int | None = None) -> Path:
    """Bring your own workload: run `command` as every rank across the emulated DCs, with the same env,
    logs, counters and manifest as an experiment (one cell named `command`; with `baseline`, first a cell
    `command__baseline` with every inter-DC link unshaped). Its optimizer's steps (seen by a hook installed at
    each rank's start: ranks.command_env), or the steps it reports itself (testbed.steplog), get the built-in
    workload's figures, the first `warmup_steps` left out; tokens/s with `tokens_per_step` (all ranks together)
    or steps it reports. `prefix` and a full disk as in run_experiment (the command's own files are not in the
    estimate: only the harness's)."""
    topology = load_topology(topology_path)
    experiment = Experiment(name=f"command-{topology.name}", topology=str(topology_path),
                            strategies=[{"name": "flat-dp"}], baseline="auto" if baseline else "none",
                            calibrate="rtt", cell_timeout=f"{timeout!r}s",  # seconds, as the CLI parsed them
                            description=f"user command: {' '.join(command)}")
    links = {k: dataclasses.asdict(v) for k, v in base_links(topology).items()}
    cells = [Cell("command", "command", {"steps": 0}, links)]
    if baseline:
        unshaped = {key: dataclasses.asdict(UNSHAPED) for key in links}
        cells.insert(0, Cell("command__baseline", "command", {"steps": 0}, unshaped, baseline=True))
    run_dir = out_root / experiment.name / datetime.now().strftime("%Y%m%d-%H%M%S")
    ranks = sum(dc.nodes for dc in topology.dcs) * ranks_per_node
    check_room(run_dir, run_bytes(cells, ranks), f"this run ({len(cells)} cells of {ranks} ranks)")
    prefix = hold(prefix)
    beside: dict[str, Owner] = {}
    try:
        with stop_when_full(run_dir, len(cells)), fabric(topology, topology_path, prefix, shaper, backend) as testbed:
            note_beside(beside, prefix)
            atomic_write(run_dir / "manifest.json", json.dumps(
                manifest(experiment, None, testbed, {"command": command, "warmup_steps": warmup_steps,
                                                     "tokens_per_step": tokens_per_step,
                                                     "prefix": prefix, "shared_host": shared_host(beside)}), indent=1))
            if progress:
                progress.start(len(cells), 0, run_dir)
                progress.console.print(f"[dim]testbed prefix: {prefix}[/dim]")
            for cell in cells:
                cancel.check()
                room_for_cell(run_dir, cell_bytes(cell, ranks), len(cells), None)
                note_beside(beside, prefix)
                if progress:
                    progress.cell(cell)
                result = run_cell(testbed, cell, command, run_dir / "cells" / cell.id, timeout, "rtt", ranks_per_node,
                                  extra_env=command_env(tokens_per_step))
                failed_for_room(run_dir / "cells" / cell.id, result, cell_bytes(cell, ranks), len(cells), None)
                if progress:
                    progress.done(cell, result)
            note_beside(beside, prefix)
            return finish_run(run_dir, shared_host(beside))
    finally:
        release(prefix)

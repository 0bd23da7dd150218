"""Run an experiment cell by cell on a fabric (any backend) and write results/<experiment>/<run>/cells/.

The run loop: plan the cells, skip those complete (--resume), check the disk's room, hold a prefix, bring the
testbed up (testbed.runner.session), write the manifest, calibrate the cost model, then run each cell
(testbed.runner.cell) and close the manifest. The fabric is always torn down, also on Ctrl-C or a failure. The
tables, plots and report are testbed.collect's, built from that directory.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from testbed.atomic import write_text as atomic_write
from testbed.fabric import cancel, registry
from testbed.fabric.backend import Backend
from testbed.fabric.ownership import Owner, release
from testbed.runner.calibrate import CALIBRATION_FILE, calibrate_for_model
from testbed.runner.cell import complete, run_cell
from testbed.runner.cells import plan_cells
from testbed.runner.forks import fork_server, launcher_forks
from testbed.runner.manifest import manifest
from testbed.runner.ranks import workload_argv
from testbed.runner.session import fabric, finish_run, hold, note_beside, shared_host
from testbed.runner.space import cell_bytes, check_room, failed_for_room, room_for_cell, run_bytes, stop_when_full
from testbed.spec.experiment import load_experiment
from testbed.spec.strategies import TORCHFT


def latest_run(out_root: Path, name: str) -> Path | None:
    runs = sorted(p for p in (out_root / name).glob("*") if (p / "manifest.json").exists())
    return runs[-1] if runs else None


def run_experiment(path: Path, out_root: Path, *, prefix: str | None = None, shaper: str = "auto",
                   resume: bool = False, only: str | None = None, progress: Any = None,
                   backend: str | Backend = registry.DEFAULT, launcher: str = "auto",
                   meanwhile: Callable[[], None] | None = None) -> Path:
    """Run (or resume) an experiment; returns the run directory (its report is testbed.collect's to build).
    Tears the fabric down whatever happens. `prefix`: None for one of the run's own that nobody else holds
    (ownership.claim_free), so that runs go side by side. `launcher`: how ranks start
    (testbed.runner.ranks.LAUNCHERS). `meanwhile`: work to do while the fork server imports torch (the CLI readies
    the report's plotting). OutOfSpace before the testbed comes up when the results' file system has too little
    room for the run, and as soon as a write fails for want of space (what was kept stays; --resume finishes)."""
    fork = launcher_forks(launcher, backend)
    experiment, topology = load_experiment(path)
    cells = plan_cells(experiment, topology)
    if only:
        cells = [c for c in cells if fnmatch.fnmatch(c.id, only) or only in c.id]
    run_dir = latest_run(out_root, experiment.name) if resume else None
    if run_dir is None:
        run_dir = out_root / experiment.name / datetime.now().strftime("%Y%m%d-%H%M%S")
    todo = [c for c in cells if not complete(run_dir / "cells" / c.id)]
    ranks = sum(dc.nodes for dc in topology.dcs) * experiment.workload.ranks_per_node
    check_room(run_dir, run_bytes(todo, ranks, experiment.restarts), f"this run ({len(todo)} cells of {ranks} ranks)")
    resume_argv = ["testbed", "run", str(path), "--resume"] + (["--out", str(out_root)] if out_root != Path("results")
                                                                else []) + (["--only", only] if only else [])
    prefix = hold(prefix)
    beside: dict[str, Owner] = {}
    try:
        with stop_when_full(run_dir, len(cells), resume_argv):
            run_dir.mkdir(parents=True, exist_ok=True)
            if progress:
                progress.start(len(cells), len(cells) - len(todo), run_dir)
                progress.console.print(f"[dim]testbed prefix: {prefix}[/dim]")
            with fabric(topology, path, prefix, shaper, backend) as testbed, \
                    fork_server(testbed, fork and bool(todo), run_dir, meanwhile) as forks:
                note_beside(beside, prefix)
                if not (run_dir / "manifest.json").exists():
                    atomic_write(run_dir / "manifest.json", json.dumps(manifest(
                        experiment, path, testbed, {"prefix": prefix, "shared_host": shared_host(beside)}), indent=1))
                if todo and experiment.calibrate != "none" and not (run_dir / CALIBRATION_FILE).exists():
                    calibrate_for_model(testbed, run_dir, experiment, progress, forks)
                for cell in todo:
                    cancel.check()
                    # torchft's replica groups ride out a death themselves: their job never restarts
                    restarts = 0 if cell.baseline or cell.options.get("strategy") in TORCHFT else experiment.restarts
                    room_for_cell(run_dir, cell_bytes(cell, ranks, restarts), len(cells), resume_argv)
                    note_beside(beside, prefix)
                    argv = workload_argv(cell.workload_args())
                    if progress:
                        progress.cell(cell)
                    cell_dir = run_dir / "cells" / cell.id
                    result = run_cell(testbed, cell, argv, cell_dir, experiment.cell_timeout,
                                      experiment.calibrate, experiment.workload.ranks_per_node,
                                      on_tick=(lambda d, c=cell: progress.tick(d, c.options["steps"])) if progress
                                      else None,
                                      faults=[] if cell.baseline else experiment.faults, seed=experiment.workload.seed,
                                      sdc_replay=experiment.sdc_replay, sdc_replay_by=experiment.sdc_replay_by,
                                      forks=forks, restarts=restarts, checkpoint_every=experiment.checkpoint_every)
                    failed_for_room(cell_dir, result, cell_bytes(cell, ranks, restarts), len(cells), resume_argv)
                    if progress:
                        progress.done(cell, result)
                note_beside(beside, prefix)
            return finish_run(run_dir, shared_host(beside))
    finally:
        release(prefix)  # a run's own prefix, also when the testbed never came up

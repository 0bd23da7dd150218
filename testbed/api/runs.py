"""Runs: an experiment cell by cell, or the user's own command on every rank, into a run directory; the
report of a run directory; two runs side by side; a run's verdicts (cells, thresholds, regressions).

A run brings its own testbed up and down (testbed.runner.session, under a prefix of its own unless one is
given): the runner's fabric() is the same "brought up, always torn down" as testbed.api.testbed()."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.api.errors import UserError, user_errors

if TYPE_CHECKING:
    import pandas as pd

    from testbed.fabric.backend import Backend


def run(experiment: Path, out_dir: Path = Path("results"), *, prefix: str | None = None, shaper: str = "auto",
        resume: bool = False, only: str | None = None, backend: str | Backend = "netns", launcher: str = "auto",
        progress: Any = None) -> Path:
    """Run (or `resume`) the experiment in file `experiment`, the cells whose id matches `only` or all, under
    `out_dir`/<experiment>/<run>; its run directory (report(run_dir) builds the report). `prefix`: None for one
    of the run's own. `progress`: run_progress(console) or None. A full disk is a UserError (exit 1;
    the cells done are kept, `resume` finishes)."""
    from testbed.collect.report import warm
    from testbed.runner.experiment import run_experiment
    from testbed.runner.space import OutOfSpace

    try:
        with user_errors():  # meanwhile: the report's imports are paid while the fork server imports torch
            return run_experiment(experiment, out_dir, prefix=prefix, shaper=shaper, resume=resume, only=only,
                                  progress=progress, backend=backend, launcher=launcher, meanwhile=warm)
    except OutOfSpace as error:
        raise UserError(str(error), 1) from error


def run_command(topology: Path, command: list[str], out_dir: Path = Path("results"), *, prefix: str | None = None,
                shaper: str = "auto", ranks_per_node: int = 1, timeout: float = 3600.0,
                backend: str | Backend = "netns", baseline: bool = False, warmup_steps: int = 2,
                tokens_per_step: int | None = None, progress: Any = None) -> Path:
    """Bring your own workload: `command` run as every rank of `topology` (torchrun's environment), stopped
    after `timeout` seconds, with the figures of an experiment's cell (and with `baseline`, first one with every
    inter-DC link unshaped); its run directory. A full disk is a UserError (exit 1)."""
    from testbed.runner.command import run_command as run_it
    from testbed.runner.space import OutOfSpace

    if not command:
        raise UserError("--topology needs a command after --, e.g. testbed run --topology T -- python train.py")
    try:
        with user_errors():
            return run_it(topology, command, out_dir, prefix=prefix, shaper=shaper, ranks_per_node=ranks_per_node,
                          timeout=timeout, progress=progress, backend=backend, baseline=baseline,
                          warmup_steps=warmup_steps, tokens_per_step=tokens_per_step)
    except OutOfSpace as error:
        raise UserError(str(error), 1) from error


def run_progress(console: Any) -> Any:
    """The progress display of a run (cells done, the current cell's steps) on a rich Console: for `progress`."""
    from testbed.runner.progress import RunProgress

    return RunProgress(console)


def _run_dir(path: Path) -> None:
    if not (path / "manifest.json").exists():
        raise UserError(f"{path}: not a run directory (no manifest.json)")


def report(run_dir: Path) -> Path:
    """Build the tables, plots and report of a run directory; the report's path. A full disk is a UserError
    (exit 1) that says the cells are kept and how to finish."""
    from testbed.collect.report import build_report  # pandas and matplotlib: not for a file refused at load time
    from testbed.runner.space import OutOfSpace, kept_cells, stop_when_full

    _run_dir(run_dir)
    try:
        with stop_when_full(run_dir, len(kept_cells(run_dir))):
            return build_report(run_dir)
    except OutOfSpace as error:
        raise UserError(str(error), 1) from error


def compare(first: Path, second: Path) -> pd.DataFrame:
    """Two runs side by side: throughput and efficiency per strategy and sweep point, one row each (a pandas
    DataFrame; empty when they have nothing in common)."""
    from testbed.collect.compare import compare_runs

    for path in (first, second):
        _run_dir(path)
    return compare_runs(first, second)


def cells(run_dir: Path) -> dict[str, Any]:
    """A run's cells: total, and failed (each cell's result: cell, status, reason, ...)."""
    from testbed.collect.frames import load_results

    results = load_results(run_dir)
    return {"total": len(results), "failed": [r for r in results if r["status"] != "ok"]}


def check(run_dir: Path, *, junit: Path | None = None, against: Path | None = None, tolerance: str | float = "5%",
          rebuild: bool = True) -> dict[str, Any]:
    """A run's verdicts: cells (as cells()), thresholds (each: passed, ...), regressions against the run
    `against` of the same experiment (tokens/s fell or inter-DC bytes per step rose by more than `tolerance`;
    None without one), junit (the JUnit file written, if asked) and passed: every cell completed, every
    threshold held, nothing regressed. `rebuild`: the report first (its figures are what is checked)."""
    from testbed.collect.frames import load_points, load_results
    from testbed.collect.gates import regressions, write_junit
    from testbed.collect.report import build_report
    from testbed.spec import units

    for path in (run_dir, against):
        if path is not None:
            _run_dir(path)
    try:
        fraction = tolerance if isinstance(tolerance, float) else units.parse_fraction(tolerance)
    except ValueError as error:
        raise UserError(f"testbed check: --tolerance: {error}") from None
    if against is not None:
        names = [json.loads((p / "manifest.json").read_text())["experiment"] for p in (run_dir, against)]
        if names[0] != names[1]:
            raise UserError(f"--against: {against} is a run of {names[1]!r}, not of {names[0]!r}")
    if rebuild:
        build_report(run_dir)
    counted = cells(run_dir)
    checks = json.loads((run_dir / "thresholds.json").read_text())
    regressed = None if against is None else regressions(load_points(run_dir), load_points(against), fraction)
    if junit is not None:
        manifest = json.loads((run_dir / "manifest.json").read_text())
        write_junit(junit, manifest["experiment"], load_results(run_dir), checks, regressed,
                    str(against) if against is not None else None)
    passed = not counted["failed"] and all(item["passed"] for item in checks + (regressed or []))
    return {"cells": counted, "thresholds": checks, "regressions": regressed, "against": against,
            "tolerance": fraction, "junit": junit, "passed": passed}

"""The cost model, without building anything (no root): predict every cell of an experiment and name the
fastest strategy per sweep point (`plan`); scaling efficiency at real scale against distance and bandwidth
(`whatif`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.api.errors import UserError, user_errors


def plan(experiment: Path, calibration: Path | None = None, *, search: bool = False) -> dict[str, Any]:
    """Every cell of the experiment predicted (cells: one dict each), the fastest strategy per sweep point,
    the calibration used (the shipped reference without `calibration`: its machine and date); with `search`,
    strategy options explored and one recommended per point."""
    from testbed.model.calibration import CalibrationError
    from testbed.model.commands import plan_experiment
    from testbed.model.predict import NoComputeProfile

    try:
        with user_errors():
            return plan_experiment(experiment, calibration, with_search=search)
    except CalibrationError as error:
        raise UserError(str(error)) from None
    except NoComputeProfile as error:
        raise UserError(f"{experiment}: {error}") from None


def whatif(scenario: Path, out_dir: Path | None = None) -> dict[str, Any]:
    """Predicted scaling efficiency per strategy against distance and inter-DC bandwidth, at real scale:
    scenario (the loaded spec), answers at its reference point, reference, recommendation, scale, and files
    (the table, plot and report written under `out_dir`, default results/whatif/<name>)."""
    from testbed.model.commands import whatif_scenario

    with user_errors():
        return whatif_scenario(scenario, out_dir)

"""What the CLI's model commands do (`plan`, `whatif`), as functions over files returning plain data; the
CLI renders them. (`calibrate` needs a testbed: testbed.runner.calibrate.calibrate_file.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.model.calibration import Calibration, load_calibration
from testbed.model.planner import plan, search
from testbed.spec.experiment import load_experiment


def plan_experiment(experiment_path: Path, calibration_path: Path | None = None, *,
                    with_search: bool = False) -> dict[str, Any]:
    """Every cell of the experiment predicted (nothing built, no root) and the fastest strategy per sweep
    point; with_search: recommended options per point. Raises SpecError / CalibrationError / NoComputeProfile."""
    experiment, topology = load_experiment(experiment_path)
    calibration = load_calibration(calibration_path) if calibration_path else Calibration()
    result = plan(experiment, topology, calibration)
    result["calibration"] = str(calibration_path) if calibration_path else \
        "none (the transport's default parameters: run `testbed calibrate` for figures of this machine)"
    if with_search:
        result["search"] = search(experiment, topology, calibration)
    return result


def whatif_scenario(scenario_path: Path, out_dir: Path | None = None) -> dict[str, Any]:
    """A scenario at real scale: its table of predicted scaling efficiency per strategy and the plot."""
    from testbed.model.whatif import evaluate, write_outputs
    from testbed.spec.scenario import load_scenario

    scenario = load_scenario(scenario_path)
    table = evaluate(scenario)
    out_dir = out_dir or Path("results") / "whatif" / scenario.name
    files = write_outputs(scenario, table, out_dir)
    return {"scenario": scenario, "table": table, "files": files}

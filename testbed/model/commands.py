"""What the CLI's model commands do (`plan`, `whatif`), as functions over files returning plain data; the
CLI renders them. (`calibrate` needs a testbed: testbed.api.calibrate.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.model import shapes
from testbed.model.calibration import load_calibration, provenance, reference_for
from testbed.model.planner import plan, search
from testbed.spec.experiment import load_experiment


def plan_experiment(experiment_path: Path, calibration_path: Path | None = None, *,
                    with_search: bool = False) -> dict[str, Any]:
    """Every cell of the experiment predicted (nothing built, no root) and the fastest strategy per sweep
    point (and those within the model's error of it); with_search: recommended options per point. Without a
    calibration of the user's, the shipped reference calibration for this workload. Raises SpecError /
    CalibrationError / NoComputeProfile."""
    experiment, topology = load_experiment(experiment_path)
    if calibration_path:
        calibration, reference = load_calibration(calibration_path), False
    else:
        wl = experiment.workload
        seq_len = wl.seq_len or (shapes.PRESETS[wl.preset].seq_len if wl.preset in shapes.PRESETS else None)
        calibration_path, calibration = reference_for(wl.preset, wl.micro_batch, seq_len)
        reference = True
    result = plan(experiment, topology, calibration)
    result["calibration"] = {"file": str(calibration_path), "reference": reference,
                             "provenance": provenance(calibration)}
    if with_search:
        result["search"] = search(experiment, topology, calibration)
    return result


def whatif_scenario(scenario_path: Path, out_dir: Path | None = None) -> dict[str, Any]:
    """A scenario at real scale: its table of predicted scaling efficiency (and compute utilisation) per
    strategy, the plot, and its published figures checked (PASS/FAIL each)."""
    from testbed.model.whatif import (
        answers,
        check_figures,
        evaluate,
        recommendation,
        reference_text,
        scale_text,
        write_outputs,
    )
    from testbed.spec.scenario import load_scenario

    scenario = load_scenario(scenario_path)
    table = evaluate(scenario)
    out_dir = out_dir or Path("results") / "whatif" / scenario.name
    files = write_outputs(scenario, table, out_dir)
    rows = answers(scenario)
    return {"scenario": scenario, "table": table, "files": files, "answers": rows,
            "reference": {"distance_m": scenario.reference["distance"], "bandwidth_bit_s": scenario.reference["bandwidth"],
                          "text": reference_text(scenario)},
            "recommendation": recommendation(scenario, rows), "scale": scale_text(scenario),
            "checks": check_figures(scenario)}

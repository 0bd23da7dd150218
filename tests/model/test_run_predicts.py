"""A run calibrates the cost model first and every cell carries its prediction (root: the quickstart run the session shares)."""

from __future__ import annotations

import csv
import json
import math

import pytest

pytestmark = pytest.mark.root


def test_a_run_is_calibrated_and_predicted(netns_quickstart):
    """The session's one quickstart cell on netns (tests/conftest.py; tests/fabric/docker compares its report with the
    compose path's)."""
    assert netns_quickstart.proc.returncode == 0, netns_quickstart.proc.stderr[-3000:]
    run_dir = netns_quickstart.run_dir
    calibration = json.loads((run_dir / "calibration.json").read_text())
    assert calibration["fit"]["samples"] >= 8 and calibration["transport"]["op_overhead"] >= 0
    measured = json.loads((run_dir / "calibration" / "measured.json").read_text())  # the raw figures, to refit
    assert measured["launcher"] == "fork"  # the run's fork server started the calibration's ranks too
    computes = [r for r in measured["records"] if r.get("event") == "compute"]  # real compute: profiled
    assert len(computes) == measured["world"] and len({len(r["reps"]) for r in computes}) == 1
    # each repetition: every rank at one instant, so the profile has the ranks' contention of a step: the ranks'
    # starts spread over less than half the repetition's shortest compute (the same load lengthens both)
    for starts, reps in zip(zip(*(r["starts"] for r in computes)), zip(*(r["reps"] for r in computes))):
        assert max(starts) - min(starts) < 0.5 * min(reps), (starts, reps)
    profile = calibration["compute"][0]["seconds"]
    assert profile == pytest.approx(sorted(max(reps) for reps in zip(*(r["reps"] for r in computes)))[
        len(computes[0]["reps"]) // 2])
    optimizer = calibration["compute"][0]["optimizer_seconds"]  # each optimizer's step after each repetition
    assert set(optimizer) == {"adamw", "sgd"} and all(0 < seconds < profile for seconds in optimizer.values())
    assert all(len(r["optimizer_reps"]["adamw"]) == len(r["reps"]) for r in computes)
    rows = list(csv.DictReader(open(run_dir / "summary.csv")))
    assert len(rows) == 1
    for column in ("step_s_predicted", "tokens_per_s_predicted", "inter_dc_bytes_predicted", "step_error"):
        assert math.isfinite(float(rows[0][column])), column
    predicted, step = float(rows[0]["step_s_predicted"]), float(rows[0]["step_s_mean"])
    assert 0.05 < predicted < 10 * step  # at least the compute, never absurd
    report = (run_dir / "report.md").read_text()
    assert "## Predicted vs measured" in report and "Cost model: the mean step" in report
    assert (run_dir / "plots" / "model.png").exists()

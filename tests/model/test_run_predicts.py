"""One short root test: a run calibrates the cost model first and every cell carries its prediction."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from ..conftest import run_cli

pytestmark = pytest.mark.root

EXPERIMENT = """name: predicted
topology:
  name: pair
  dcs: [{name: east, nodes: 1}, {name: west, nodes: 1}]
  links: [{between: [east, west], latency: 5ms, bandwidth: 1gbit}]
workload: {steps: 4, warmup_steps: 1, micro_batch: 2, micro_batches: 1, compute: synthetic, compute_ms: 50}
strategies: [flat-dp]
baseline: none
calibrate: rtt
cell_timeout: 120
"""


def test_a_run_is_calibrated_and_predicted(prefix, tmp_path: Path):
    path = tmp_path / "exp.yaml"
    path.write_text(EXPERIMENT)
    proc = run_cli("run", str(path), "--out", str(tmp_path / "out"), timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = next((tmp_path / "out" / "predicted").glob("*"))
    calibration = json.loads((run_dir / "calibration.json").read_text())
    assert calibration["fit"]["samples"] >= 8 and calibration["transport"]["op_overhead"] >= 0
    measured = json.loads((run_dir / "calibration" / "measured.json").read_text())  # the raw figures, to refit
    assert measured["launcher"] == "fork"  # the run's fork server started the calibration's ranks too
    rows = list(csv.DictReader(open(run_dir / "summary.csv")))
    assert len(rows) == 1
    for column in ("step_s_predicted", "tokens_per_s_predicted", "inter_dc_bytes_predicted", "step_error"):
        assert math.isfinite(float(rows[0][column])), column
    predicted, step = float(rows[0]["step_s_predicted"]), float(rows[0]["step_s_mean"])
    assert 0.05 < predicted < 10 * step  # at least the compute, never absurd
    report = (run_dir / "report.md").read_text()
    assert "## Predicted vs measured" in report and "Cost model: the mean step" in report
    assert (run_dir / "plots" / "model.png").exists()

"""`testbed emulate` end to end on the netns fabric (root): a scenario this test writes, one point, two strategies,
each scale cell with its baseline on one testbed, emulate.csv and the report, nothing left behind.

The scale model's derivation is the model side's (testbed.model.scale_model); this test gives run_emulate a
stand-in `derive` of the seam's shape, so that it holds the runner and not the derivation."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from testbed import api
from tests.conftest import namespaces_with

pytestmark = pytest.mark.root

SCENARIO = """name: tiny-two-dc
model: {parameters: 1e9, layers: 8, hidden: 2048, seq_len: 1024, bytes_per_gradient: 2}
dcs: 2
gpus_per_dc: 8
global_batch_tokens: 65536
gpu: {peak_tflops: 989, mfu: 0.4}
intra: {bandwidth: 400gbit, latency: 5us}
reference: {distance: 2000km, bandwidth: 10gbit}
sweep: {distance: [2000km], bandwidth: [10gbit]}
strategies:
  - {name: flat-dp, kind: flat-dp}
  - {name: hier-dp, kind: hier-dp}
published: {model: "a test's"}
assumed: {gpus_per_dc: "a test's"}
"""


@dataclass(frozen=True)
class StandIn:
    """testbed.model.scale_model.ScaleCell's fields (the seam), for this test's stand-in derivation."""

    strategy: str
    kind: str
    distance_km: float
    bandwidth_gbit: float
    efficiency_full_scale: float
    efficiency_scale_model_predicted: float
    groups_full: dict[str, float]
    groups_scale: dict[str, float]
    unmatched: dict[str, str] = field(default_factory=dict)
    experiment: dict[str, Any] = field(default_factory=dict)


def derive(scenario: Any, points: str = "reference", calibration: Any = None) -> list[StandIn]:
    """Two cells on one topology (one testbed): 10 ms one way over 100 Mbit/s, the built-in workload."""
    assert points == "reference"
    cells = []
    for spec in scenario.strategies:
        experiment = {
            "name": f"scale-{spec.name}",
            "topology": {"name": "scale", "dcs": [{"name": "east", "nodes": 1}, {"name": "west", "nodes": 1}],
                         "links": [{"between": ["east", "west"], "latency": "10ms", "bandwidth": "100mbit"}]},
            "workload": {"steps": 4, "warmup_steps": 1, "micro_batch": 2, "micro_batches": 1},
            "strategies": [{"name": spec.kind}], "calibrate": "none", "cell_timeout": "120s"}
        cells.append(StandIn(spec.name, spec.kind, 2000.0, 10.0, 0.5, 0.5, {"rtt_over_compute": 1.0},
                             {"rtt_over_compute": 1.0}, {}, experiment))
    return cells


def test_emulate_runs_every_scale_cell_with_its_baseline_on_one_testbed(prefix, tmp_path, monkeypatch):
    from testbed.runner import session

    brought_up = []
    real = session.bring_up
    monkeypatch.setattr(session, "bring_up", lambda *a, **k: brought_up.append(1) or real(*a, **k))
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(SCENARIO)
    result = api.emulate(scenario, tmp_path / "out", points="reference", prefix=prefix, derive=derive)
    run_dir = result["run_dir"]
    assert run_dir.parent == tmp_path / "out" / "tiny-two-dc-emulate"
    rows = list(csv.DictReader(open(run_dir / "emulate.csv")))
    assert [r["strategy"] for r in rows] == ["flat-dp", "hier-dp"] and all(r["status"] == "ok" for r in rows), [r["status"] for r in rows]
    for row in rows:
        cell_dir = run_dir / row["cell_path"]
        results = [json.loads(p.read_text()) for p in (cell_dir / "cells").glob("*/result.json")]
        assert sorted(r["cell"]["baseline"] for r in results) == [False, True]
        assert (cell_dir / "experiment.yaml").exists() and (cell_dir / "manifest.json").exists()
        # a 20 ms round trip on every step's sync costs the cell against its unshaped baseline
        assert 0.0 < float(row["efficiency_measured"]) < 0.95, row
        assert row["rtt_over_compute_full"] == row["rtt_over_compute_scale"] == "1.0"
    assert len(brought_up) == 1  # both cells ran on the testbed the first brought up
    prefixes = {json.loads((run_dir / r["cell_path"] / "manifest.json").read_text())["prefix"] for r in rows}
    assert prefixes == {prefix}
    assert "## Reading" in (run_dir / "emulate.md").read_text() and (run_dir / "plots" / "emulate.png").exists()
    assert namespaces_with(prefix) == []

"""A run with a faults: timeline on the netns fabric (root): a partition at a step is applied on time through the
fabric, cleared, recorded in faults.json; flat-dp stalls about as long and still finishes; summary.csv carries
the stall; a kill fails the cell naming the timeline; no fault is left in force after the run."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ..conftest import namespaces_with, run_cli
from .test_run import run_dir_of

pytestmark = pytest.mark.root

TOPOLOGY = """  name: pair
  dcs: [{name: east, nodes: 1}, {name: west, nodes: 1}]
  links: [{between: [east, west], latency: 2ms, bandwidth: 1gbit}]
"""
PARTITION_S = 2.0


def experiment(tmp: Path, faults: str, steps: int = 10) -> Path:
    path = tmp / "exp.yaml"
    path.write_text(f"name: tiny\ntopology:\n{TOPOLOGY}workload: {{steps: {steps}, warmup_steps: 1, micro_batch: 2, "
                    "micro_batches: 1, compute: synthetic, compute_ms: 50}\nstrategies: [flat-dp]\n"
                    f"baseline: none\ncalibrate: none\ncell_timeout: 120\nfaults:\n{faults}")
    return path


def test_a_partition_at_a_step_stalls_flat_dp_about_as_long_and_it_finishes(prefix, tmp_path):
    faults = f"  - {{kind: partition, between: [east, west], at: step 4, duration: {PARTITION_S}s}}\n"
    proc = run_cli("run", str(experiment(tmp_path, faults)), "--out", str(tmp_path / "out"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = run_dir_of(tmp_path / "out")
    (cell,) = list((run_dir / "cells").iterdir())
    record = json.loads((cell / "faults.json").read_text())
    assert record["errors"] == [] and len(record["faults"]) == 1
    entry = record["faults"][0]
    assert entry["kind"] == "partition" and entry["target"] == "east<->west"
    assert 0 <= entry["applied_at"] - entry["scheduled_at"] < 0.25  # the bound (goal: 50 ms)
    assert entry["cleared_at"] - entry["applied_at"] == pytest.approx(PARTITION_S, abs=0.25)
    result = json.loads((cell / "result.json").read_text())
    assert result["status"] == "ok" and result["faults"] == record
    (row,) = list(csv.DictReader(open(run_dir / "summary.csv")))
    # the step that met the partition waited for it (and for TCP's retransmission after it), no step before did
    assert PARTITION_S * 0.8 <= float(row["stall_s"]) <= PARTITION_S * 4, row["stall_s"]
    assert float(row["effective_time_ratio"]) < 0.8 and row["faults_applied"] == "1"
    assert namespaces_with(prefix) == []


def test_a_killed_rank_fails_its_cell_naming_the_timeline(prefix, tmp_path):
    faults = "  - {kind: kill, rank: 1, at: step 2}\n"
    proc = run_cli("run", str(experiment(tmp_path, faults, steps=6)), "--out", str(tmp_path / "out"), timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    run_dir = run_dir_of(tmp_path / "out")
    (cell,) = list((run_dir / "cells").iterdir())
    result = json.loads((cell / "result.json").read_text())
    assert result["status"] == "failed" and result["failed_rank"] == 1
    assert "signal 9" in result["reason"] and "killed by the faults: timeline" in result["reason"]
    assert namespaces_with(prefix) == []

"""emulate.csv and the scale model's report from a fabricated run directory (no root): measured efficiency is a
cell's tokens/s over its baseline's, the winners by each of the three efficiencies, and the Reading's counts and
explanations."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from testbed.collect.emulate import build, table, winners

TOKENS = 1000.0


def fake_cell(run_dir: Path, name: str, strategy: str, base_s: float, shaped_s: float, tcp: dict | None = None,
              failed: bool = False) -> str:
    """A scale cell's run directory as testbed.runner.emulate writes it: a baseline and the cell, 4 steps each."""
    cell_dir = run_dir / "cells" / name
    (cell_dir).mkdir(parents=True)
    (cell_dir / "manifest.json").write_text(json.dumps({"warmup_steps": 1, "tcp": tcp or {}}))
    for index, (cell_id, baseline, wall) in enumerate(((f"{strategy}__baseline__r0", True, base_s),
                                                        (f"{strategy}__r0", False, shaped_s))):
        out = cell_dir / "cells" / cell_id
        (out / "metrics").mkdir(parents=True)
        status = "failed" if failed and not baseline else "ok"
        (out / "result.json").write_text(json.dumps({
            "cell": {"id": cell_id, "strategy": strategy, "baseline": baseline, "repetition": 0, "sweep": {}},
            "status": status, "reason": "rank 0 died" if status == "failed" else "", "started": float(index)}))
        (out / "metrics" / "rank0.jsonl").write_text("".join(
            json.dumps({"event": "step", "step": step, "wall_s": wall, "tokens": TOKENS}) + "\n" for step in range(4)))
    return str(cell_dir.relative_to(run_dir))


def fake_run(tmp_path: Path, hier_far_s: float = 1.6, unmatched: dict | None = None) -> Path:
    run_dir = tmp_path / "run"
    records = []
    # (strategy, distance, full-scale, scale-predicted, baseline step s, shaped step s)
    for strategy, distance, full, predicted, base, shaped in (("flat-dp", 10, 0.9, 0.9, 1.0, 1.1),
                                                              ("flat-dp", 1000, 0.3, 0.32, 1.0, 3.0),
                                                              ("hier-dp", 10, 0.95, 0.95, 1.0, 1.05),
                                                              ("hier-dp", 1000, 0.8, 0.8, 1.0, hier_far_s)):
        path = fake_cell(run_dir, f"{strategy}__{distance}km__100gbit", strategy, base, shaped,
                         tcp={"tcp_slow_start_after_idle": "1"})
        records.append({"strategy": strategy, "kind": strategy, "distance_km": float(distance),
                        "bandwidth_gbit": 100.0, "efficiency_full_scale": full,
                        "efficiency_scale_model_predicted": predicted,
                        "groups_full": {"inter_over_compute": distance / 100}, "groups_scale": {"inter_over_compute":
                                                                                                distance / 100},
                        "unmatched": (unmatched or {}) if (strategy, distance) == ("hier-dp", 1000) else {},
                        "path": path})
    (run_dir / "scale_model.json").write_text(json.dumps(records))
    (run_dir / "manifest.json").write_text(json.dumps({"scenario": "s", "points": "distance", "git_commit": "abc"}))
    return run_dir


def test_csv_has_the_three_efficiencies_groups_and_paths(tmp_path):
    run_dir = fake_run(tmp_path)
    build(run_dir)
    rows = list(csv.DictReader(open(run_dir / "emulate.csv")))
    assert [r["strategy"] for r in rows] == ["flat-dp", "flat-dp", "hier-dp", "hier-dp"]
    measured = [float(r["efficiency_measured"]) for r in rows]
    assert measured == pytest.approx([1 / 1.1, 1 / 3.0, 1 / 1.05, 1 / 1.6])  # tokens/s over the baseline's
    assert rows[1]["inter_over_compute_full"] == rows[1]["inter_over_compute_scale"] == "10.0"
    assert all((run_dir / r["cell_path"] / "manifest.json").exists() for r in rows)
    assert {"efficiency_full_scale", "efficiency_scale_model_predicted", "bandwidth_gbit", "distance_km",
            "unmatched"} <= set(rows[0])
    assert (run_dir / "plots" / "emulate.png").stat().st_size > 0


def test_reading_counts_agreement_and_names_what_explains_a_row(tmp_path):
    run_dir = fake_run(tmp_path, unmatched={"window_over_bdp": "the window floor is 64 KiB: 3x the full scale's"})
    text = build(run_dir).read_text()
    # hier-dp at 1000 km: measured 0.625 against 0.8 (-0.175); the other three within 0.05
    assert "3 of 4 measured rows (75%) are within 0.05" in text
    far = next(line for line in text.splitlines() if line.startswith("- hier-dp at 1000 km"))
    assert "-0.175" in far and "window_over_bdp" in far and "slow start after an idle phase" in far
    assert "the fastest strategy measured is the full scale's at 2 of 2 points" in text


def test_winners_by_each_efficiency_and_a_failed_cell(tmp_path):
    run_dir = fake_run(tmp_path, hier_far_s=4.0)  # hier-dp measured 0.25 at 1000 km: flat-dp's 0.33 wins there
    wins = winners(table(run_dir))
    far = wins[wins["distance_km"] == 1000].iloc[0]
    assert far["winner_full_scale"] == "hier-dp" and far["winner_measured"] == "flat-dp" and not far["agree"]
    assert "fastest measured is flat-dp, the full scale's hier-dp" in build(run_dir).read_text()
    broken = tmp_path / "broken"
    path = fake_cell(broken, "flat-dp__10km__100gbit", "flat-dp", 1.0, 1.1, failed=True)
    (broken / "scale_model.json").write_text(json.dumps([{"strategy": "flat-dp", "distance_km": 10.0,
                                                          "bandwidth_gbit": 100.0, "efficiency_full_scale": 0.9,
                                                          "path": path}]))
    row = table(broken).iloc[0]
    assert row["status"].startswith("failed: flat-dp__r0") and row["efficiency_measured"] is None


def test_a_tie_is_every_strategy_within_it_and_agrees_where_it_shares_one():
    import pandas as pd

    frame = pd.DataFrame([{"strategy": s, "distance_km": 10.0, "bandwidth_gbit": 1.0, "efficiency_full_scale": f,
                           "efficiency_scale_model_predicted": f, "efficiency_measured": m}
                          for s, f, m in (("a", 0.9, 0.80), ("b", 0.902, 0.857), ("c", 0.5, 0.86))])
    row = winners(frame).iloc[0]
    assert row["winner_full_scale"] == "a = b" and row["winner_measured"] == "b = c" and row["agree"]

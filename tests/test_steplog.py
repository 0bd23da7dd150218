"""The bring-your-own step metrics helper and what collect makes of its lines (no root, no torch)."""

import ast
import csv
import json
import sys
from pathlib import Path

import pytest

from testbed.collect.report import build_report
from testbed.steplog import StepLog, closed
from tests.conftest import ROOT


def test_the_helper_needs_nothing_but_the_standard_library():
    tree = ast.parse((ROOT / "testbed" / "steplog.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported - {"testbed"} <= sys.stdlib_module_names, imported
    ours = {f"{node.module}.{alias.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module.startswith("testbed") for alias in node.names}
    assert ours <= {"testbed.rankenv"}, ours  # itself standard library only: tests/test_rankenv.py


def test_without_a_metrics_directory_it_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("TESTBED_METRICS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    log = StepLog()
    record = log.step(tokens=64, loss=2.5)
    log.close()
    assert record["step"] == 0 and record["tokens"] == 64 and record["wall_s"] >= 0
    assert list(tmp_path.iterdir()) == []


def test_lines_follow_the_documented_format(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_METRICS_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    with StepLog(parameters=10) as log:
        log.step(tokens=128, loss=4.0)
        log.step(tokens=128, wall_s=0.5, exposed_s=0.1)
    lines = [json.loads(line) for line in (tmp_path / "rank3.jsonl").read_text().splitlines()]
    assert lines[0]["event"] == "start" and lines[0]["rank"] == 3 and lines[0]["parameters"] == 10
    assert [(r["event"], r["step"], r["rank"], r["tokens"]) for r in lines[1:3]] == [("step", 0, 3, 128.0),
                                                                                    ("step", 1, 3, 128.0)]
    assert lines[1]["loss"] == 4.0 and lines[1]["wall_s"] >= 0
    assert lines[2]["wall_s"] == 0.5 and lines[2]["exposed_s"] == 0.1 and lines[2]["loss"] is None
    assert lines[3]["event"] == "end" and lines[3]["steps"] == 2 and len(lines) == 4  # close(): the script is done


def test_the_file_says_closed_only_after_close_and_until_the_next_step(tmp_path):
    path = tmp_path / "rank0.jsonl"
    log = StepLog(tmp_path, rank=0)
    log.step(tokens=1)
    assert closed(path) is None
    log.close()
    log.close()  # twice: one end line
    assert closed(path)["steps"] == 1 and path.read_text().count('"end"') == 1
    again = StepLog(tmp_path, rank=0)  # the script logs again (a second phase): not closed until that one is
    again.step(tokens=1)
    assert closed(path) is None and closed(tmp_path / "missing.jsonl") is None


def fake_command_run(run_dir: Path, walls: dict[str, list[list[float]]]) -> None:
    """A `testbed run --topology T --baseline` directory whose two cells' ranks reported with StepLog."""
    (run_dir / "manifest.json").parent.mkdir(parents=True)
    (run_dir / "manifest.json").write_text(json.dumps({"experiment": "command-pair", "warmup_steps": 1}))
    for started, (cell, per_rank) in enumerate(walls.items()):
        cell_dir = run_dir / "cells" / cell
        (cell_dir / "metrics").mkdir(parents=True)
        (cell_dir / "result.json").write_text(json.dumps({
            "cell": {"id": cell, "strategy": "command", "baseline": cell.endswith("baseline"), "repetition": 0,
                     "sweep": {}}, "status": "ok", "reason": "", "seconds": 9.0, "started": started,
            "link_bytes": {"east->west": {"tx_bytes": 4_000_000}}}))
        for rank, rank_walls in enumerate(per_rank):
            with StepLog(cell_dir / "metrics", rank=rank) as log:
                for wall in rank_walls:
                    log.step(tokens=100, loss=3.0, wall_s=wall)


def test_a_command_reporting_with_the_helper_gets_tokens_per_s_and_efficiency(tmp_path):
    run_dir = tmp_path / "run"
    # step 0 is warm-up; a step lasts as long as its slowest rank: 0.1 s unshaped, 0.25 s shaped
    fake_command_run(run_dir, {"command__baseline": [[9.0, 0.1, 0.1], [9.0, 0.08, 0.1]],
                               "command": [[9.0, 0.2, 0.2], [9.0, 0.25, 0.25]]})
    build_report(run_dir)
    rows = {r["cell"]: r for r in csv.DictReader(open(run_dir / "summary.csv"))}
    assert float(rows["command__baseline"]["tokens_per_s"]) == pytest.approx(2 * 200 / 0.2)
    assert float(rows["command"]["tokens_per_s"]) == pytest.approx(2 * 200 / 0.5)
    assert float(rows["command"]["efficiency_vs_single_site"]) == pytest.approx(0.4)
    assert float(rows["command"]["step_s_mean"]) == pytest.approx(0.25)
    assert rows["command"]["exposed_comm_share"] == ""  # not reported, so not invented
    report = (run_dir / "report.md").read_text()
    assert "fastest is **command** at 800 tokens/s" in report
    assert "command falls below 90% of the best single-site throughput: 40% (its steps do not report" in report
    assert (run_dir / "plots" / "efficiency.png").exists() and (run_dir / "plots" / "loss.png").exists()


def test_the_reading_says_when_the_nodes_ran_a_congestion_control_the_model_does_not_simulate():
    import pandas as pd

    from testbed.collect.report import model_lines

    summary = pd.DataFrame([{"cell": "a__r0", "status": "ok", "baseline": False, "step_error": 0.2,
                             "step_s_mean": 1.0, "step_s_predicted": 0.8}])
    on_bbr = model_lines(summary, {"tcp_congestion_control": "bbr", "tcp_slow_start_after_idle": "1"})
    assert any("**bbr**" in line and "congestion_control: cubic" in line for line in on_bbr)
    for tcp in ({"tcp_congestion_control": "cubic"}, {"tcp_congestion_control": "reno"}, {}, None):
        assert not any("ran TCP" in line for line in model_lines(summary, tcp))
    assert model_lines(summary, {"tcp_congestion_control": "bbr"})[0].startswith("Cost model:")

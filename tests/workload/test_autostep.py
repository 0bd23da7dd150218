"""Step metrics of a script nobody changed (testbed.workload.autostep, installed by the sitecustomize of
testbed/workload/autostep_site): real Python processes with that directory on PYTHONPATH, no root; and what the report
makes of the lines, with and without tokens, and of a command that never stepped."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.collect.report import build_report
from testbed.runner.ranks import AUTOSTEP_SITE, INTERPRETER_NOTE, command_env, missing_torch
from testbed.steplog import StepLog, step_records
from testbed.workload import autostep

TWO_OPTIMIZERS = """
import torch
model = torch.nn.Linear(4, 1)
first, second = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.Adam(model.parameters())
for _ in range(3):
    first.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    first.step()
    second.step()  # a second optimizer: not a second training step
"""


def python(code: str, tmp: Path, **env: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter whose PYTHONPATH is what a command's rank gets (AUTOSTEP_SITE first)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TESTBED_", "RANK", "WORLD_"))}
    environ.update({**command_env(), "TESTBED_METRICS_DIR": str(tmp / "metrics"), "RANK": "1", "WORLD_SIZE": "4",
                    **env})
    return subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120)


def lines(tmp: Path, rank: int = 1) -> list[dict]:
    path = tmp / "metrics" / f"rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_every_step_of_the_first_optimizer_is_a_steplog_line(tmp_path):
    proc = python(TWO_OPTIMIZERS, tmp_path, TESTBED_TOKENS_PER_STEP="100")
    assert proc.returncode == 0, proc.stderr
    start, *steps = lines(tmp_path)
    assert start["event"] == "start" and start["source"] == "autostep" and start["optimizer"] == "SGD"
    assert start["python"] == sys.executable
    assert [(r["event"], r["step"], r["rank"], r["tokens"], r["source"]) for r in steps] == [
        ("step", step, 1, 25.0, "autostep") for step in range(3)]  # 100 per step over 4 ranks
    assert all(r["wall_s"] > 0 and r["loss"] is None for r in steps)


def test_without_tokens_per_step_a_step_has_no_tokens(tmp_path):
    assert python(TWO_OPTIMIZERS, tmp_path).returncode == 0
    assert [r["tokens"] for r in lines(tmp_path)[1:]] == [None, None, None]


def test_a_process_that_never_steps_writes_nothing_and_one_without_torch_never_imports_it(tmp_path):
    proc = python("import sys, torch; print('torch.optim.optimizer' in sys.modules)", tmp_path)
    assert proc.stdout.split() == ["True"] and not (tmp_path / "metrics").exists()
    proc = python("import sys; print('torch' in sys.modules, type(sys.meta_path[0]).__name__)", tmp_path)
    assert proc.stdout.split() == ["False", "_OnImport"], proc.stderr  # armed, nothing imported


def test_the_sitecustomize_it_hides_still_runs(tmp_path):
    hidden = tmp_path / "theirs"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = 'yes'\n")
    code = TWO_OPTIMIZERS + "import os, sitecustomize\nprint(os.environ.get('THEIRS_RAN'), sitecustomize.__file__)\n"
    proc = python(code, tmp_path, PYTHONPATH=f"{AUTOSTEP_SITE}{os.pathsep}{hidden}")
    assert proc.stdout.split() == ["yes", str(hidden / "sitecustomize.py")], proc.stderr
    assert len(lines(tmp_path)) == 4  # and the hook is in place


def test_a_rank_without_torch_names_its_interpreter_and_the_runner_says_it(tmp_path):
    proc = python("import sys\nsys.modules['torch'] = None  # as an interpreter without torch\nimport torch\n", tmp_path)
    assert proc.returncode == 1 and "ModuleNotFoundError" in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last == INTERPRETER_NOTE + sys.executable and autostep.INTERPRETER_NOTE == INTERPRETER_NOTE
    assert missing_torch(["python", "train.py"], proc.stderr.splitlines()) == (
        f"`python` (on the rank's PATH) ran {sys.executable}, which cannot import torch: put the interpreter that "
        "has torch after --, e.g. `testbed run --topology T -- .venv/bin/python train.py`")
    assert missing_torch(["/opt/py/bin/python", "t.py"], [last]).startswith(f"`/opt/py/bin/python` ran {sys.executable}")
    assert missing_torch(["python", "train.py"], ["Traceback", "ValueError: nope"]) is None


def test_a_script_that_reports_its_own_steps_is_counted_once(tmp_path):
    code = "from testbed.steplog import StepLog\nlog = StepLog()\n" + TWO_OPTIMIZERS.replace(
        "    second.step()", "    log.step(tokens=7)")
    assert python(code, tmp_path).returncode == 0
    records = lines(tmp_path)
    assert {r.get("source") for r in records if r["event"] == "step"} == {None, "autostep"}  # both wrote
    assert [(r["step"], r["tokens"]) for r in step_records(tmp_path / "metrics" / "rank1.jsonl")] == [
        (0, 7.0), (1, 7.0), (2, 7.0)]  # the script's own lines count


def command_run(run_dir: Path, walls: dict[str, list[float] | None], seconds: dict[str, float],
                tokens: float | None = None) -> None:
    """A `testbed run --topology T --baseline` directory of two ranks whose steps the optimizer hook wrote (None: no
    step seen)."""
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text(json.dumps({"experiment": "command-pair", "warmup_steps": 1,
                                                       "command": ["python", "train.py"]}))
    for started, (cell, cell_walls) in enumerate(walls.items()):
        cell_dir = run_dir / "cells" / cell
        (cell_dir / "metrics").mkdir(parents=True)
        (cell_dir / "result.json").write_text(json.dumps({
            "cell": {"id": cell, "strategy": "command", "baseline": cell.endswith("baseline"), "repetition": 0,
                     "sweep": {}}, "status": "ok", "reason": "", "seconds": seconds[cell], "started": started,
            "link_bytes": {"east->west": {"tx_bytes": 1000}}}))
        for rank in range(2):
            with StepLog(cell_dir / "metrics", rank=rank, source="autostep") as log:
                for wall in cell_walls or []:
                    log.step(tokens, wall_s=wall, source="autostep")


def test_without_tokens_the_report_has_step_times_and_efficiency_in_steps_per_second(tmp_path):
    command_run(tmp_path / "run", {"command__baseline": [5.0, 0.1, 0.1, 0.1], "command": [5.0, 0.4, 0.4, 0.4]},
                {"command__baseline": 9.0, "command": 11.0})
    build_report(tmp_path / "run")
    rows = {r["cell"]: r for r in csv.DictReader(open(tmp_path / "run" / "summary.csv"))}
    assert rows["command"]["tokens_per_s"] == "" and float(rows["command"]["steps_per_s"]) == pytest.approx(2.5)
    assert float(rows["command"]["efficiency_vs_single_site"]) == pytest.approx(0.25)
    assert rows["command"]["step_source"] == "optimizer hook"
    report = (tmp_path / "run" / "report.md").read_text()
    reading = report.split("## Reading", 1)[1].split("##", 1)[0]
    assert ("- Your command's step (the optimizer's steps, seen by testbed's hook: no line of the script changed): "
            "median 0.400 s across the DCs, 0.100 s with every inter-DC link unshaped (the baseline): **25%** "
            "efficiency against the baseline (steps per second; for tokens/s give --tokens-per-step N).") in reading
    assert "fastest is **command** at 2.50 steps/s" in reading and "nan" not in reading
    assert (tmp_path / "run" / "plots" / "throughput.png").exists()


def test_with_tokens_the_reading_gives_tokens_per_second_too(tmp_path):
    command_run(tmp_path / "run", {"command__baseline": [5.0, 0.1, 0.1], "command": [5.0, 0.2, 0.2]},
                {"command__baseline": 9.0, "command": 11.0}, tokens=50)
    build_report(tmp_path / "run")
    reading = (tmp_path / "run" / "report.md").read_text().split("## Reading", 1)[1]
    assert "**50%** efficiency against the baseline; 500 tokens/s against 1,000." in reading


def test_a_command_that_never_stepped_is_read_by_its_wall_time_start_up_included(tmp_path):
    command_run(tmp_path / "run", {"command__baseline": None, "command": None},
                {"command__baseline": 8.0, "command": 12.0})
    build_report(tmp_path / "run")
    reading = (tmp_path / "run" / "report.md").read_text().split("## Reading", 1)[1].split("##", 1)[0]
    assert ("No optimizer step was seen, so no step time: the cells' wall times, start-up included (interpreter, "
            "imports, process group): 12.0 s across the DCs against 8.0 s with every inter-DC link unshaped (the "
            "baseline): **67%** of the baseline's pace.") in reading

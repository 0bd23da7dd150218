"""What the `testbed` command prints for people and for programs: `plan` on every shipped experiment with the
shipped reference calibration (and without root), ties within the model's error, tables never cut when piped,
--output table|json|csv, --version, -h, bare `testbed`, whatif's reference point and recommendation, and
`compose EXPERIMENT` for an experiment with its topology inline."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from testbed.cli.commands import app
from testbed.model.calibration import model_error, reference_calibrations, reference_for
from testbed.model.labels import point_label
from testbed.model.planner import verdicts

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.yaml"))
TESTBED = [sys.executable, "-m", "testbed"]
NOBODY = 65534


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The command as a user runs it, stdout a pipe (not a terminal)."""
    return subprocess.run([*TESTBED, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)


# --- the reference calibration --------------------------------------------------------------------------------

def test_every_reference_calibration_says_where_and_when_it_was_measured():
    shipped = reference_calibrations()
    assert shipped, "no reference calibration in the package"
    for path, calibration in shipped:
        reference = calibration.source["reference"]
        assert reference["machine"] and reference["commit"] and reference["command"].startswith("testbed calibrate")
        assert calibration.source["measured"], path
        assert calibration.compute, f"{path}: no compute profile"
        assert 0 < model_error(calibration) < 1, path


def test_the_reference_for_a_workload_is_the_one_that_profiled_it():
    for _, calibration in reference_calibrations():
        for profile in calibration.compute:
            _, chosen = reference_for(profile.preset, profile.micro_batch, profile.seq_len)
            assert any((p.preset, p.micro_batch, p.seq_len) == (profile.preset, profile.micro_batch, profile.seq_len)
                       for p in chosen.compute)


def test_plan_says_which_calibration_and_its_machine_and_date():
    proc = cli("plan", "experiments/quickstart.yaml")
    assert proc.returncode == 0, proc.stderr
    path, calibration = reference_for("tiny", 32, 64)
    first = proc.stdout.splitlines()[0]
    assert "reference calibration" in first
    assert calibration.source["measured"][:10] in first and calibration.source["reference"]["machine"] in first
    data = json.loads(cli("plan", "experiments/quickstart.yaml", "--output", "json").stdout)
    assert data["calibration"]["reference"] is True and data["calibration"]["file"] == str(path)


def test_a_calibration_of_the_users_replaces_the_reference(tmp_path):
    _, calibration = reference_calibrations()[0]
    calibration.fit["median_abs_error"] = 0.5
    calibration.source["measured"] = "2031-01-02T03:04:05+00:00"
    calibration.source.pop("reference")
    mine = calibration.save(tmp_path / "mine.json")
    data = json.loads(cli("plan", "experiments/quickstart.yaml", "--calibration", str(mine), "--output", "json").stdout)
    assert data["calibration"] == {"file": str(mine), "reference": False,
                                   "provenance": data["calibration"]["provenance"]}
    assert "2031-01-02 03:04 UTC" in data["calibration"]["provenance"]
    assert data["model_error"] == 0.5


@pytest.mark.root
def test_plan_runs_on_every_shipped_experiment_without_root():
    """As user nobody (setpriv drops root), with a HOME of its own and no calibration: exit 0 on every experiment."""
    if not shutil.which("setpriv"):
        pytest.skip("no setpriv (util-linux)")
    home = Path(tempfile.mkdtemp(prefix="testbed-nobody-"))
    try:
        os.chown(home, NOBODY, NOBODY)
        drop = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups"]
        readable = subprocess.run([*drop, sys.executable, "-c", "import testbed.cli"], cwd=ROOT, capture_output=True,
                                  text=True, env={**os.environ, "HOME": str(home)})
        if readable.returncode != 0:
            pytest.skip(f"user nobody cannot read this checkout or its venv: {readable.stderr.strip()[-200:]}")
        for experiment in EXPERIMENTS:
            proc = subprocess.run([*drop, *TESTBED, "plan", str(experiment.relative_to(ROOT))], cwd=ROOT,
                                  capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(home)})
            assert proc.returncode == 0, f"{experiment.name}: {proc.stderr}"
            assert "reference calibration" in proc.stdout, experiment.name
    finally:
        shutil.rmtree(home)


# --- ties within the model's error ------------------------------------------------------------------------------

class _Prediction:
    def __init__(self, strategy: str, rate: float, sweep: dict, baseline: bool = False):
        self.strategy, self.sweep, self.baseline, self.cell = strategy, sweep, baseline, f"{strategy}-{sweep}"
        self.prediction = type("P", (), {"tokens_per_s": rate})()


def test_a_gap_inside_the_model_error_is_a_tie_and_one_outside_is_not():
    near = {"links[east,west].latency": "20ms"}
    far = {"links[east,west].latency": "40ms"}
    found = verdicts([_Prediction("a", 100.0, near), _Prediction("b", 96.0, near), _Prediction("c", 50.0, near),
                      _Prediction("a", 100.0, far), _Prediction("b", 94.0, far),
                      _Prediction("b", 1000.0, far, baseline=True)], model_error=0.05)
    assert found["links[east,west].latency=20ms"]["tied"] == ["b"]  # 4 % apart: a tie; c, 50 % behind, is not
    assert found["links[east,west].latency=40ms"]["tied"] == []  # 6 % apart
    assert found["links[east,west].latency=40ms"]["best"] == "a"  # baselines are no candidates
    assert found["links[east,west].latency=20ms"]["label"] == "east–west latency 20 ms"


def test_distance_sweep_with_the_reference_calibration_calls_gaps_inside_its_error_ties():
    data = json.loads(cli("plan", "experiments/distance-sweep.yaml", "--output", "json").stdout)
    error = data["model_error"]
    assert data["calibration"]["reference"] and error > 0
    tied = [p for p in data["points"].values() if p["tied"]]
    for point in data["points"].values():
        assert bool(point["tied"]) == (point["gap"] < error), point
    assert tied, f"no gap inside the model's error of {error:.1%}: {data['points']}"
    text = cli("plan", "experiments/distance-sweep.yaml").stdout
    for point in tied:
        assert f"at {point['label']}: tie between" in text and "within model error" in text


def test_plan_shows_efficiency_against_single_site_beside_tokens_per_second():
    data = json.loads(cli("plan", "experiments/quickstart.yaml", "--output", "json").stdout)
    cells = data["cells"]
    best = max(c["tokens_per_s_predicted"] for c in cells if c["baseline"])
    for cell in cells:
        if not cell["baseline"]:
            assert cell["efficiency_vs_single_site_predicted"] == pytest.approx(cell["tokens_per_s_predicted"] / best)
    header = next(line for line in cli("plan", "experiments/quickstart.yaml").stdout.splitlines() if "tokens/s" in line)
    assert header.index("tokens/s") < header.index("vs single site")


# --- piped output, --output --------------------------------------------------------------------------------------

def test_a_piped_plan_prints_every_cell_name_whole_on_one_line():
    proc = cli("plan", "experiments/hierarchical-vs-flat.yaml")
    assert proc.returncode == 0, proc.stderr
    names = [c["cell"] for c in json.loads(cli("plan", "experiments/hierarchical-vs-flat.yaml", "--json").stdout)["cells"]]
    lines = proc.stdout.splitlines()
    for name in names:
        (row,) = [line for line in lines if f" {name} " in line]
        assert "ms per step" in row or "exposed" in row, row  # the explanation on the same line, not wrapped
    assert "…" not in proc.stdout


def test_plan_as_csv_has_one_row_per_cell():
    data = json.loads(cli("plan", "experiments/quickstart.yaml", "--output", "json").stdout)
    rows = list(csv.DictReader(io.StringIO(cli("plan", "experiments/quickstart.yaml", "--output", "csv").stdout)))
    assert [r["cell"] for r in rows] == [c["cell"] for c in data["cells"]]
    assert float(rows[-1]["tokens_per_s_predicted"]) == pytest.approx(data["cells"][-1]["tokens_per_s_predicted"])


def test_a_bad_output_format_is_one_line_and_exit_2():
    runner = CliRunner()
    for args in (["plan", "experiments/quickstart.yaml", "--output", "xml"], ["status", "--output", "xml"],
                 ["compare", "a", "b", "--output", "xml"], ["whatif", "scenarios/x.yaml", "--output", "xml"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "--output: expected table, json or csv, got 'xml'" in result.output


def test_every_command_that_prints_a_table_takes_output():
    runner = CliRunner()
    for command in (["up"], ["status"], ["probe"], ["plan"], ["whatif"], ["compare"], ["check"], ["hosts", "check"]):
        result = runner.invoke(app, [*command, "--help"], terminal_width=200)
        assert "--output" in result.output, command


# --- habits: --version, -h, bare testbed, one spelling ------------------------------------------------------------

def test_version_h_and_bare_testbed():
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("testbed ")
    bare = cli()
    assert bare.returncode == 0 and "Usage" in bare.stdout and "plan" in bare.stdout
    short = cli("plan", "-h")
    assert short.returncode == 0 and "--calibration" in short.stdout


def test_a_file_to_write_is_o_or_out_everywhere():
    runner = CliRunner()
    for command in ("run", "probe", "compose", "calibrate", "whatif"):
        text = runner.invoke(app, [command, "--help"], terminal_width=200).output
        assert "--out" in text and " -o " in text, command
        assert "--output " not in text or command not in ("compose", "calibrate"), command  # its alias: hidden


# --- whatif -----------------------------------------------------------------------------------------------------

def test_whatif_prints_its_reference_point_and_a_recommendation(tmp_path):
    proc = cli("whatif", "scenarios/nemotron-340b-two-dc.yaml", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(cli("whatif", "scenarios/nemotron-340b-two-dc.yaml", "--out", str(tmp_path),
                          "--output", "json").stdout)
    best = max(data["answers"], key=lambda row: row["efficiency"])
    assert data["recommendation"]["strategy"] == best["strategy"]
    assert proc.stdout.startswith(f"reference point: {data['reference']['text']}")
    assert "1,000 km and 1.6 Tbit/s" in data["reference"]["text"]
    assert data["recommendation"]["line"] in proc.stdout
    report = (tmp_path / "report.md").read_text()
    assert "recommended at 1,000 km" in report.lower()
    assert "| never" in report and "nan" not in report  # flat-dp reaches the target at no bandwidth


def test_whatif_prefers_a_strategy_that_keeps_the_optimiser_when_it_reaches_the_target():
    from testbed.model.whatif import recommendation
    from testbed.spec.scenario import load_scenario

    scenario = load_scenario(ROOT / "scenarios" / "diloco-bandwidth.yaml")
    rows = [{"strategy": "hier-dp-overlap", "efficiency": 0.96}, {"strategy": "diloco-h100", "efficiency": 0.99},
            {"strategy": "streaming-diloco-h100", "efficiency": 0.98}]
    assert recommendation(scenario, rows)["strategy"] == "hier-dp-overlap"
    rows[0]["efficiency"] = 0.5  # below the target: DiLoCo, with what it changes said
    chosen = recommendation(scenario, rows)
    assert chosen["strategy"] == "diloco-h100" and "check the loss" in chosen["line"]


# --- labels -----------------------------------------------------------------------------------------------------

def test_sweep_points_read_as_people_write_them():
    assert point_label({"links[east,west].latency": "0ms"}) == "east–west latency 0 ms"
    assert point_label({"links[east,west].distance": "1000km"}) == "east–west distance 1,000 km"
    assert point_label({"links[*].bandwidth": "400gbit", "workload.micro_batches": 4}) == \
        "bandwidth of every link 400 Gbit/s, micro-batches 4"
    assert point_label({}) == "every cell"


# --- compose EXPERIMENT -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["pipeline-across-dcs", "faults"])
def test_compose_takes_an_experiment_with_its_topology_inline(tmp_path, name):
    import yaml

    target = tmp_path / "compose" / f"{name}.yml"
    result = CliRunner().invoke(app, ["compose", f"experiments/{name}.yaml", "-o", str(target)])
    assert result.exit_code == 0, result.output
    document = yaml.safe_load(target.read_text())
    command = document["services"]["controller"]["command"]
    assert command[:4] == ["python", "-m", "testbed", "run"] and command[4].endswith(f"/{name}.yaml")
    experiment = yaml.safe_load((ROOT / "experiments" / f"{name}.yaml").read_text())
    nodes = sum(dc["nodes"] for dc in experiment["topology"]["dcs"])
    assert sum(1 for s in document["services"].values() if s["labels"].get("testbed.role") == "node") == nodes


def test_compose_of_an_experiment_alone_is_compose_of_its_topology_and_it():
    runner = CliRunner()
    alone = runner.invoke(app, ["compose", "experiments/quickstart.yaml"]).output
    both = runner.invoke(app, ["compose", "topologies/two-dc.yaml", "experiments/quickstart.yaml"]).output
    assert alone.splitlines()[1:] == both.splitlines()[1:]  # all but the header naming the command


# --- the report, for people -------------------------------------------------------------------------------------

def test_the_reports_tables_and_reading_are_for_people(tmp_path):
    """A run with a sweep (written as `testbed run` writes it, ranks reporting with steplog): the Reading and the
    Results table say 'east–west latency 20 ms', thousands separators, % and MB; summary.csv keeps the numbers."""
    from testbed.collect.report import build_report
    from testbed.steplog import StepLog

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "manifest.json").write_text(json.dumps({"experiment": "labels", "warmup_steps": 1}))
    key = "links[east,west].latency"
    for started, (cell, sweep, wall) in enumerate([("command__baseline", {}, 0.001),
                                                   ("command__latency-east-west=20ms", {key: "20ms"}, 0.002)]):
        cell_dir = run_dir / "cells" / cell
        (cell_dir / "metrics").mkdir(parents=True)
        (cell_dir / "result.json").write_text(json.dumps({
            "cell": {"id": cell, "strategy": "command", "baseline": not sweep, "repetition": 0, "sweep": sweep},
            "status": "ok", "reason": "", "seconds": 9.0, "started": started,
            "link_bytes": {"east->west": {"tx_bytes": 4_000_000}}}))
        with StepLog(cell_dir / "metrics", rank=0) as log:
            for _ in range(4):
                log.step(tokens=100, loss=3.0, wall_s=wall)
    build_report(run_dir)
    report = (run_dir / "report.md").read_text()
    assert "At east–west latency 20 ms: fastest is **command** at 50,000 tokens/s" in report
    results = report.split("## Results", 1)[1].split("##", 1)[0]
    assert "| east–west latency" in results and "| 20 ms" in results and "| 50,000" in results
    assert "| 1.00 " in results  # MB per step: the 4 MB the kernel counted over the cell's 4 steps
    assert "| 50.0%" in results  # against single site (100,000 tokens/s unshaped)
    assert "links[" not in results and "nan" not in results
    rows = list(csv.DictReader(open(run_dir / "summary.csv")))
    assert float(next(r for r in rows if r["baseline"] == "False")["tokens_per_s"]) == pytest.approx(50_000)


def test_the_reports_model_section_says_the_runs_calibration_replaced_the_reference(tmp_path):
    from testbed.collect.report import MODEL_TEXT, model_text

    assert model_text(tmp_path) == MODEL_TEXT  # no calibration of its own: nothing to say
    _, calibration = reference_calibrations()[0]
    calibration.source = {"measured": "2031-01-02T03:04:05+00:00", "host_cpus": 16, "kernel": "6.1.0"}
    calibration.save(tmp_path / "calibration.json")
    text = model_text(tmp_path)
    assert "the run's own (measured 2031-01-02 03:04 UTC on 16 CPUs, kernel 6.1.0)" in text
    profile = calibration.compute[0]
    _, reference = reference_for(profile.preset, profile.micro_batch, profile.seq_len)
    assert f"replaced the shipped reference calibration (measured {reference.source['measured'][:10]}" in text


def test_help_has_no_bool_placeholder_and_every_command_takes_h():
    import typer.main

    runner = CliRunner()
    group = typer.main.get_command(app)
    names = [[name] for name in group.commands if name != "hosts"] + [["hosts", "check"]]
    assert ["plan"] in names and ["whatif"] in names
    for name in names:
        result = runner.invoke(app, [*name, "-h"], terminal_width=200)
        assert result.exit_code == 0, (name, result.output)
        assert "<bool>" not in result.output, name


def _rendered(table) -> str:
    from rich.console import Console

    console = Console(width=300, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


def test_status_and_compare_tables_read_as_people_write():
    import pandas as pd

    from testbed.cli.render import compare_table, status_tables

    info = {"nodes": [], "links": [{"key": "east->west", "latency": "10ms", "bandwidth": "1gbit", "jitter": "0",
                                    "loss": "0.1%", "queue": 12000, "mechanism": "userspace-delay"}]}
    row = next(line for line in _rendered(status_tables(info)[1]).splitlines() if "east->west" in line)
    assert all(text in row for text in ("10 ms", "1 Gbit/s", "0 ms", "0.1 %", "12,000")), row
    frame = pd.DataFrame([{"strategy": "flat-dp", "baseline": "False", "links[east,west].latency": "20ms",
                           "tokens_per_s A": 41_100.0, "tokens_per_s B": 20_550.0, "tokens_per_s B/A": 0.5,
                           "scaling_efficiency A": 0.9, "scaling_efficiency B": 0.45, "inter_dc_gb_per_step A": 0.00286,
                           "inter_dc_gb_per_step B": float("nan")}])
    text = _rendered(compare_table(frame))
    assert "east–west latency" in text and "20 ms" in text and "41,100" in text and "0.50×" in text
    assert "90.0%" in text and "2.86" in text and "nan" not in text and "4.11e+04" not in text


def test_up_dry_run_as_json_and_csv():
    plan = json.loads(cli("up", "topologies/two-dc.yaml", "--dry-run", "--output", "json").stdout)
    ends = [end["key"] for end in plan["link_ends"]]
    assert "east->west" in ends and "west->east" in ends
    rows = list(csv.DictReader(io.StringIO(cli("up", "topologies/two-dc.yaml", "--dry-run", "--output", "csv").stdout)))
    assert [row["link_end"] for row in rows] == ends
    assert next(row for row in rows if row["link_end"] == "east->west")["latency"] == "10ms"
